"""The web page's timeline (admin/_timeline.py) over the history's one fold (_view.saga_view_of):
where its bars go in time, and how attempts, back-offs, waits and parked periods are
drawn. (The rendered page is tested in tests/admin/test_web.py.)"""

from __future__ import annotations


def test_the_timeline_follows_timestamps_and_outcomes() -> None:
    from datetime import UTC, datetime, timedelta

    from saga_engine.admin._timeline import timeline
    from saga_engine.core.history._events import (
        AttemptTimedOut,
        CommandIssued,
        Event,
        ReplyReceived,
    )
    from saga_engine.core.views._view import saga_view_of

    t0 = datetime(2030, 1, 1, tzinfo=UTC)

    def issued(seconds: int, command_id: str, attempt: int) -> CommandIssued:
        return CommandIssued(
            at=t0 + timedelta(seconds=seconds),
            step="pay",
            participant="bank",
            command_type="Pay",
            payload={},
            payload_hash="h",
            command_id=command_id,
            attempt=attempt,
        )

    events: list[Event] = [
        issued(0, "c1", 1),
        AttemptTimedOut(at=t0 + timedelta(seconds=30), step="pay", command_id="c1", attempt=1),
        issued(40, "c2", 2),
        ReplyReceived(
            at=t0 + timedelta(seconds=50), step="pay", command_id="c2", outcome="success"
        ),
        issued(60, "c3", 3),  # still awaiting its reply at t0 + 100s
    ]
    line = timeline(saga_view_of(events), now=t0 + timedelta(seconds=100))
    assert line.axis == "time"
    [row] = line.rows
    assert [(b.outcome, b.x, b.width) for b in row.bars] == [
        ("timed_out", 0.0, 30.0),
        ("success", 40.0, 10.0),
        ("pending", 60.0, 40.0),
    ]
    assert [t.label for t in line.ticks][:3] == ["+0 s", "+30 s", "+60 s"]


def test_the_timeline_draws_back_offs_waits_and_parked_periods() -> None:
    from datetime import UTC, datetime, timedelta

    from saga_engine.admin._timeline import timeline
    from saga_engine.core.history._events import (
        CommandIssued,
        ErrorInfo,
        Event,
        ReplyReceived,
        SagaParked,
        SagaResumed,
        SagaStarted,
        SignalReceived,
        TimerFired,
        TimerStarted,
    )
    from saga_engine.core.views._view import Lane, saga_view_of

    t0 = datetime(2030, 1, 1, tzinfo=UTC)

    def at(seconds: int) -> datetime:
        return t0 + timedelta(seconds=seconds)

    def issued(seconds: int, attempt: int) -> CommandIssued:
        return CommandIssued(
            at=at(seconds),
            step="pay",
            participant="bank",
            command_type="Pay",
            payload={},
            payload_hash="h",
            command_id=f"c{attempt}",
            attempt=attempt,
        )

    events: list[Event] = [
        SagaStarted(at=t0, saga_type="t", input={}),
        issued(0, 1),
        ReplyReceived(at=at(10), step="pay", command_id="c1", outcome="retryable"),
        TimerStarted(at=at(10), timer_id="retry:pay:1", purpose="retry", fire_at=at(20)),
        TimerFired(at=at(20), timer_id="retry:pay:1"),
        issued(20, 2),
        ReplyReceived(at=at(30), step="pay", command_id="c2", outcome="success"),
        TimerStarted(
            at=at(30), timer_id="signal:confirm:1", purpose="signal_timeout", fire_at=at(90)
        ),
        SignalReceived(at=at(50), signal_id="s1", name="confirm"),
        SagaParked(at=at(60), error=ErrorInfo(type="NondeterminismError", message="changed")),
        SagaResumed(at=at(80), principal="ann", reason="fixed"),
    ]
    line = timeline(saga_view_of(events), now=at(100))
    rows = {(r.lane, r.name): [(b.outcome, b.x, b.width) for b in r.bars] for r in line.rows}
    assert rows[(Lane.STEP, "pay")] == [
        ("retryable", 0.0, 10.0),
        ("backoff", 10.0, 10.0),  # the pause between the attempts, in the step's row
        ("success", 20.0, 10.0),
    ]
    assert rows[(Lane.WAIT, "signal confirm")] == [("received", 30.0, 20.0)]
    assert rows[(Lane.PARKED, "parked")] == [("resumed", 60.0, 20.0)]
    assert [r.lane for r in line.rows][-1] == Lane.PARKED

"""The stored shape of every event type is what the engine wrote before events were
msgspec structs (``event_shapes.json``, written by the pydantic events of commit 8ed35a3):
for each kind, one event with only its required fields and one with every field set,
written as the same JSON (the same keys, the same values: optional fields left out when
None where they were, datetimes with ``Z``, floats as floats) and read back equal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from saga_engine.core.history._events import (
    EVENT_TYPES,
    AttemptTimedOut,
    CallbackAwaited,
    CallbackReceived,
    CancelRequested,
    CarriedCompensation,
    CommandIssued,
    CompensationCompleted,
    CompensationForced,
    CompensationIssued,
    CompensationSpec,
    CompensationStarted,
    CompensationStuck,
    DomainEventReceived,
    ErrorInfo,
    Event,
    EventAwaited,
    InvalidReplyReceived,
    KeyAcquired,
    KeyQueued,
    NodeSkipped,
    ParentLink,
    PatchMarked,
    PivotPassed,
    ProgressEmitted,
    ReplyReceived,
    ReplyTimings,
    RerunLink,
    RetryRequested,
    RunContinued,
    SagaCancelled,
    SagaCompensated,
    SagaCompleted,
    SagaFailed,
    SagaParked,
    SagaResumed,
    SagaStarted,
    SideEffectRecorded,
    SignalReceived,
    StepAbandoned,
    StepParked,
    StepSkipped,
    TimerFired,
    TimerStarted,
    TriggerOrigin,
    UndoRequested,
    UpdateCompleted,
    UpdateReceived,
    event_from_dict,
    event_from_json,
    event_to_dict,
    event_to_json,
)
from saga_engine.core.history._policy import RetryPolicy
from saga_engine.core.history._structs import InvalidRecord, to_data
from saga_engine.kernel._errors import NewerEventError, SerializationError

SHAPES = Path(__file__).with_name("event_shapes.json")

AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
WHOLE = datetime(2026, 1, 2, 3, 4, 6, tzinfo=UTC)
MILLIS = datetime(2026, 1, 2, 3, 4, 7, 120000, tzinfo=UTC)
PAYLOAD: dict[str, Any] = {"a": 1, "f": 2.5, "whole": 3.0, "n": None, "l": [1, "x", True]}
ERROR = ErrorInfo(type="StepFailed", message="no funds", step="charge", details={"code": 7})
BARE_ERROR = ErrorInfo(type="StepFailed", message="no funds")
POLICY = RetryPolicy(
    max_attempts=5,
    initial_backoff=timedelta(milliseconds=250),
    max_backoff=timedelta(seconds=9),
    multiplier=1.5,
    jitter=0.0,
    on_exhausted="park",
)
SPEC = CompensationSpec(
    participant="payments", command_type="Refund", payload=PAYLOAD, retry=POLICY, timeout_s=2.5
)
BARE_SPEC = CompensationSpec(
    participant="payments", command_type="Refund", payload={}, retry=RetryPolicy()
)
TIMINGS = ReplyTimings(
    sent_at=AT,
    received_at=WHOLE,
    handler_started_at=MILLIS,
    handler_ended_at=AT,
    committed_at=WHOLE,
    handler_cpu_ms=1.25,
)
COMMAND: dict[str, Any] = {
    "step": "charge",
    "participant": "payments",
    "command_type": "Charge",
    "payload": PAYLOAD,
    "payload_hash": "0123456789abcdef",
    "command_id": "c-1",
    "attempt": 2,
}


def _pairs() -> list[tuple[Event, Event]]:
    """For each kind: (only its required fields, every field set away from its default)."""
    return [
        (
            SagaStarted(at=AT, saga_type="order", input={}),
            SagaStarted(
                at=AT,
                saga_type="order",
                input=PAYLOAD,
                idempotency_key="k",
                deadline_at=WHOLE,
                trace_context={"traceparent": "00-abc"},
                request_hash="h",
                parent=ParentLink(saga_id="p", command_id="pc", saga_type="parent"),
                trigger=TriggerOrigin(topic="t", partition=3, offset=99),
                saga_version=4,
                priority=-2,
                fairness_key="tenant",
                rerun_of=RerunLink(saga_id="old", principal="ops", reason="why"),
                flow_policy=2,
            ),
        ),
        (
            ReplyReceived(at=AT, step="charge", command_id="c-1", outcome="success"),
            ReplyReceived(
                at=AT,
                step="charge",
                command_id="c-1",
                outcome="retryable",
                compensation=True,
                payload=PAYLOAD,
                error="later",
                timings=TIMINGS,
            ),
        ),
        (
            InvalidReplyReceived(at=AT, step="s", command_id="c", error=BARE_ERROR),
            InvalidReplyReceived(
                at=AT, step="s", command_id="c", payload=PAYLOAD, unstorable=True, error=ERROR
            ),
        ),
        (
            AttemptTimedOut(at=AT, step="s", command_id="c", attempt=1),
            AttemptTimedOut(at=AT, step="s", command_id="c", attempt=3, compensation=True),
        ),
        (TimerFired(at=AT, timer_id="t"), TimerFired(at=WHOLE, timer_id="t")),
        (
            SignalReceived(at=AT, signal_id="i", name="go"),
            SignalReceived(
                at=AT, signal_id="i", name="go", payload=PAYLOAD, principal="ops", reason="r"
            ),
        ),
        (
            CancelRequested(at=AT, reason="r"),
            CancelRequested(at=AT, reason="r", principal="ops"),
        ),
        (
            UndoRequested(at=AT, command_id="c", parent_id="p"),
            UndoRequested(at=AT, command_id="c", parent_id="p", reason="r"),
        ),
        (
            CompensationForced(at=AT, reason="r"),
            CompensationForced(at=AT, reason="r", principal="ops"),
        ),
        (
            StepSkipped(at=AT, step="s"),
            StepSkipped(
                at=AT, step="s", compensation=True, payload=PAYLOAD, principal="ops", reason="r"
            ),
        ),
        (
            RetryRequested(at=AT, step="s"),
            RetryRequested(at=AT, step="s", principal="ops", reason="r", command=PAYLOAD),
        ),
        (
            SagaParked(at=AT, error=BARE_ERROR),
            SagaParked(at=AT, reason="definition_error", error=ERROR),
        ),
        (SagaResumed(at=AT), SagaResumed(at=AT, principal="ops", reason="r")),
        (
            KeyQueued(at=AT, key="k"),
            KeyQueued(at=AT, key="k", behind=["a", "b"], position=3),
        ),
        (KeyAcquired(at=AT, key="k"), KeyAcquired(at=MILLIS, key="k")),
        (
            CommandIssued(at=AT, **COMMAND),
            CommandIssued(
                at=AT,
                **COMMAND,
                timeout_at=WHOLE,
                compensation=SPEC,
                pivot=True,
                cost={"cpu": 8.0, "gpu": 1.5},
            ),
        ),
        (
            CommandIssued(at=AT, **COMMAND, compensation=BARE_SPEC),
            CommandIssued(at=AT, **COMMAND, timeout_at=MILLIS, cost={}),
        ),
        (
            TimerStarted(at=AT, timer_id="t", purpose="sleep", fire_at=WHOLE),
            TimerStarted(at=AT, timer_id="t", purpose="signal_timeout", fire_at=MILLIS),
        ),
        (
            SideEffectRecorded(at=AT, op_id="o", value=None),
            SideEffectRecorded(at=AT, op_id="o", value={"v": [1, 2.5, "x", None]}),
        ),
        (PatchMarked(at=AT, patch_id="p"), PatchMarked(at=WHOLE, patch_id="p")),
        (NodeSkipped(at=AT, node="n"), NodeSkipped(at=WHOLE, node="n")),
        (
            CompensationStarted(at=AT, reason="failure"),
            CompensationStarted(
                at=AT,
                reason="undo",
                error=ERROR,
                owed=["a", "b"],
                after={"a": ["b"], "b": []},
            ),
        ),
        (
            CompensationIssued(at=AT, **COMMAND),
            CompensationIssued(at=AT, **COMMAND, timeout_at=WHOLE, compensates=["c-0"]),
        ),
        (
            CompensationCompleted(at=AT, step="s"),
            CompensationCompleted(at=WHOLE, step="s"),
        ),
        (
            CompensationStuck(at=AT, step="s", error=BARE_ERROR),
            CompensationStuck(at=AT, step="s", error=ERROR),
        ),
        (
            StepParked(at=AT, step="s", error=BARE_ERROR),
            StepParked(at=AT, step="s", error=ERROR, in_doubt=True, past_pivot=True),
        ),
        (PivotPassed(at=AT, step="s"), PivotPassed(at=WHOLE, step="s")),
        (SagaCompleted(at=AT, output={}), SagaCompleted(at=AT, output=PAYLOAD)),
        (SagaFailed(at=AT, error=BARE_ERROR), SagaFailed(at=AT, error=ERROR)),
        (SagaCompensated(at=AT), SagaCompensated(at=AT, error=ERROR)),
        (SagaCancelled(at=AT, reason="r"), SagaCancelled(at=WHOLE, reason="r")),
        (
            EventAwaited(at=AT, wait_id="w", source="src", key="k"),
            EventAwaited(at=AT, wait_id="w", source="src", key="k", timeout_at=WHOLE),
        ),
        (
            DomainEventReceived(at=AT, wait_id="w", source="src", key="k", event_id="e"),
            DomainEventReceived(
                at=AT, wait_id="w", source="src", key="k", event_id="e", payload=PAYLOAD
            ),
        ),
        (
            UpdateReceived(at=AT, update_id="u", name="n"),
            UpdateReceived(
                at=AT, update_id="u", name="n", payload=PAYLOAD, principal="ops", reason="r"
            ),
        ),
        (
            UpdateCompleted(at=AT, update_id="u", name="n"),
            UpdateCompleted(at=AT, update_id="u", name="n", result=[1, "x"], error=ERROR),
        ),
        (
            StepAbandoned(at=AT, step="s"),
            StepAbandoned(at=AT, step="s", command_ids=["c"], in_doubt=True, reason="lost"),
        ),
        (
            ProgressEmitted(at=AT, number=1, topic="t", payload=None),
            ProgressEmitted(at=AT, number=2, topic="t", payload={"pct": 50.0}),
        ),
        (
            CallbackAwaited(
                at=AT, wait_id="w", name="n", expires_at=WHOLE, key_id="k", base_url="http://x"
            ),
            CallbackAwaited(
                at=AT, wait_id="w", name="n", expires_at=MILLIS, key_id="k", base_url="http://x"
            ),
        ),
        (
            CallbackReceived(at=AT, wait_id="w", digest="d"),
            CallbackReceived(at=AT, wait_id="w", payload=PAYLOAD, failed=True, digest="d"),
        ),
        (
            RunContinued(at=AT, run=2, first_seq=9, input={}),
            RunContinued(
                at=AT,
                run=2,
                first_seq=9,
                input=PAYLOAD,
                carry_compensations=False,
                carried=[
                    CarriedCompensation(step="charge@run1", spec=BARE_SPEC),
                    CarriedCompensation(
                        step="ship@run1",
                        spec=SPEC,
                        forward_ids=["c-1"],
                        began=3,
                        owed_at=4,
                        after=["charge@run1"],
                        run=1,
                    ),
                ],
                ticks=5,
                counters={"timer": 2},
                signals={"go": [{"x": 1}]},
                seen_signals=["i"],
                pivot_step="charge",
                key="k",
            ),
        ),
    ]


def _samples() -> list[tuple[str, Event]]:
    out: list[tuple[str, Event]] = []
    for number, (bare, full) in enumerate(_pairs()):
        out.append((f"{number}:{bare.kind}:required", bare))
        out.append((f"{number}:{full.kind}:full", full))
    return out


def _recorded() -> dict[str, str]:
    return orjson.loads(SHAPES.read_bytes())  # type: ignore[no-any-return]


def test_every_kind_has_a_recorded_shape() -> None:
    kinds = {name.split(":")[1] for name in _recorded()}
    assert kinds == {event_type.kind for event_type in EVENT_TYPES}


@pytest.mark.parametrize(
    ("name", "event"), _samples(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_an_event_is_written_as_before(name: str, event: Event) -> None:
    recorded = _recorded()[name]
    written = event_to_json(event).decode()
    # The same JSON value, with the same keys in the same order, except ``kind``, which
    # is msgspec's tag and comes first.
    assert orjson.loads(written) == orjson.loads(recorded)
    assert _ordered(written) == _ordered(recorded)
    assert event_to_dict(event) == orjson.loads(recorded)


@pytest.mark.parametrize(
    ("name", "event"), _samples(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_an_event_written_before_reads_back_equal(name: str, event: Event) -> None:
    recorded = _recorded()[name]
    assert event_from_json(recorded) == event
    assert event_from_dict(orjson.loads(recorded)) == event


def _ordered(text: str) -> list[str]:
    """The keys of an event's JSON in their order, ``kind`` left out."""
    return [key for key in orjson.loads(text) if key != "kind"]


def test_a_stored_event_that_does_not_fit_its_type_is_refused_with_where() -> None:
    written = orjson.loads(_recorded()["15:command_issued:full"])
    with pytest.raises(InvalidRecord, match=r"Expected `int`, got `str` - at `\$.attempt`"):
        event_from_dict({**written, "attempt": "2"})
    with pytest.raises(InvalidRecord, match="unknown field `extra`"):
        event_from_json(orjson.dumps({**written, "extra": 1}))
    policy = {**written["compensation"]["retry"], "max_attempts": 0}
    bad = {**written, "compensation": {**written["compensation"], "retry": policy}}
    with pytest.raises(InvalidRecord, match=r"max_attempts(.|\n)*at `\$.compensation.retry`"):
        event_from_json(orjson.dumps(bad))
    with pytest.raises(NewerEventError):
        event_from_json(orjson.dumps({**written, "kind": "command_teleported"}))
    with pytest.raises(SerializationError, match="malformed JSON"):
        event_from_json(b'{"kind": "command_issued",')


def test_a_value_json_cannot_hold_is_refused_when_written() -> None:
    with pytest.raises(SerializationError, match="cannot serialize to JSON"):
        event_to_json(SideEffectRecorded(at=AT, op_id="o", value={"x": object()}))
    with pytest.raises(SerializationError, match="cannot serialize to JSON"):
        event_to_dict(SideEffectRecorded(at=AT, op_id="o", value={"x": object()}))


def test_a_retry_policy_read_again_is_the_same_one_and_written_as_its_model_writes_it() -> None:
    recorded = _recorded()["15:command_issued:full"]
    first, again = event_from_json(recorded), event_from_json(recorded)
    assert isinstance(first, CommandIssued)
    assert isinstance(again, CommandIssued)
    assert first.compensation is not None
    assert again.compensation is not None
    assert first.compensation.retry is again.compensation.retry
    assert first.compensation.retry == POLICY
    # The same data with another type is read (and checked) on its own.
    data = orjson.loads(recorded)
    data["compensation"]["retry"]["max_attempts"] = 5.5
    with pytest.raises(InvalidRecord, match="max_attempts"):
        event_from_dict(data)
    assert to_data(SPEC)["retry"] == POLICY.model_dump(mode="json")
    assert to_data(SPEC)["retry"] is not to_data(SPEC)["retry"]  # each its own copy


if __name__ == "__main__":  # how event_shapes.json was written (by the pydantic events)
    SHAPES.write_text(
        orjson.dumps(
            {name: event_to_json(event).decode() for name, event in _samples()},
            option=orjson.OPT_INDENT_2,
        ).decode()
        + "\n"
    )

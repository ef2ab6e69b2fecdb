"""An HTTP step completed by callback that loses a race (``ctx.first``, ``ctx.timeout``)
in the pure core: given up while its request is in flight or while it waits for the
service's call, it is recorded as ``step_abandoned`` and its compensation issued at once,
exactly as a Kafka step that loses (``_undo``'s one rule); its URL closes. While the saga
stops instead (a cancel), it stays on the stack and the unwind undoes it once. Every
history replays from its stored JSON, and one recorded before this rule (the loser left
on the stack) replays as it ran (issue 41, section 2)."""

from __future__ import annotations

from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

from saga_engine import HttpRequest, Saga, SagaContext, SagaStatus, SagaTimeout, Signal
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import (
    CallbackInput,
    Cancel,
    Reply,
    SignalInput,
    StartSaga,
    TimerDue,
)
from saga_engine.core.history._events import (
    CommandIssued,
    CompensationIssued,
    CompensationStarted,
    Event,
    StepAbandoned,
    event_from_json,
    event_to_json,
)
from saga_engine.core.runtime._callbacks import body_digest
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.kernel._errors import CallbackGone
from saga_engine.kernel._settings import CallbackSettings

T0 = datetime(2030, 1, 1, tzinfo=UTC)
KEYS = CallbackSettings(keys={"k": SecretStr("unit-callback-key-" + "9" * 32)})
WAIT = "callback:fraud-check:1"
UNDO = HttpRequest(method="DELETE", path="/checks/o-1")
ACCEPTED_THEN_GIVEN_UP = [
    "command_issued",
    "reply_received",
    "step_abandoned",
    "compensation_issued",
]


class Empty(BaseModel):
    pass


class Score(BaseModel):
    score: int


class Won(BaseModel):
    won: str
    value: str = ""


def _fraud_check(ctx: SagaContext) -> Coroutine[Any, Any, Score]:
    return ctx.http_step(
        "fraud-check",
        endpoint="fraud",
        path="/checks",
        json={"order_id": "o-1"},
        returns=Score,
        compensate=UNDO,
        completion="callback",
        callback_timeout=timedelta(hours=2),
    )


class ScoreRace(Saga[Empty, Won]):
    """The fraud check (answered by callback) races the customer's stop and 15 minutes."""

    name = "score-race"
    stop = Signal(Empty)

    async def run(self, ctx: SagaContext, input: Empty) -> Won:
        won = await ctx.first(
            scored=_fraud_check(ctx),
            stopped=ctx.wait_signal(self.stop),
            expired=ctx.sleep(timedelta(minutes=15)),
        )
        value = won.value.score if isinstance(won.value, Score) else ""
        return Won(won=won.name, value=str(value))


class ScoreScope(Saga[Empty, Won]):
    """The fraud check inside a ten-minute ``ctx.timeout`` scope."""

    name = "score-scope"

    async def run(self, ctx: SagaContext, input: Empty) -> Won:
        try:
            async with ctx.timeout(timedelta(minutes=10)):
                score = await _fraud_check(ctx)
        except SagaTimeout:
            return Won(won="timed out")
        return Won(won="scored", value=str(score.score))


def start(saga: type[Saga[Empty, Won]] = ScoreRace) -> SagaRuntime:
    rt, _ = SagaRuntime.start(
        SagaDefinition.of(saga),
        StartSaga(saga_id="cb-race-1", saga_type=saga.name, input={}, at=T0),
        callbacks=KEYS,
    )
    return rt


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def request_id(rt: SagaRuntime) -> str:
    return next(e.command_id for e in rt.history if isinstance(e, CommandIssued))


def undo_id(rt: SagaRuntime) -> str:
    return next(e.command_id for e in rt.history if isinstance(e, CompensationIssued))


def accepted(rt: SagaRuntime, minutes: float) -> None:
    """The service's 202: the step's request was applied."""
    rt.handle(Reply(request_id(rt), "success", at(minutes), {"queued": True}))


def called_back(rt: SagaRuntime, minutes: float, body: dict[str, object]) -> None:
    rt.handle(CallbackInput(WAIT, at(minutes), body, False, body_digest(body, False)))


def status_of(rt: SagaRuntime) -> SagaStatus:
    return rt.status  # (read again: not the status checked before the last input)


def kinds(rt: SagaRuntime) -> list[str]:
    return [e.kind for e in rt.history if getattr(e, "step", None) == "fraud-check"]


def replays_the_same(rt: SagaRuntime, history: list[Event] | None = None) -> None:
    events = [event_from_json(event_to_json(e)) for e in (history or rt.history)]
    again, decision = SagaRuntime.replay(
        SagaDefinition.of(type(rt.state.saga)), rt.saga_id, events, callbacks=KEYS
    )
    assert decision.nondeterminism is None
    assert decision.events == []
    assert again.status == rt.status
    again.close()


@pytest.mark.parametrize("loser_by", ["timer", "signal"])
def test_accepted_and_waiting_for_its_call_the_loser_is_undone_at_once(loser_by: str) -> None:
    rt = start()
    accepted(rt, 1)
    assert rt.status == SagaStatus.RUNNING
    if loser_by == "timer":
        rt.handle(TimerDue("sleep:1", at(15)))
    else:
        rt.handle(SignalInput(signal_id="s-1", name="stop", at=at(2)))
    # Given up while it waited for the call: recorded, and undone at once (no unwind).
    assert kinds(rt) == ACCEPTED_THEN_GIVEN_UP
    [abandoned] = [e for e in rt.history if isinstance(e, StepAbandoned)]
    assert abandoned.in_doubt
    assert abandoned.command_ids == [request_id(rt)]
    [undo] = [e for e in rt.history if isinstance(e, CompensationIssued)]
    assert (undo.participant, undo.payload["method"]) == ("http:fraud", "DELETE")
    assert undo.compensates == [request_id(rt)]
    assert rt.owed_compensations() == ["fraud-check"]  # under way, not on the stack
    assert rt.status == SagaStatus.RUNNING  # it ends once its undo has completed
    rt.handle(Reply(undo_id(rt), "success", at(16), {}))
    assert status_of(rt) == SagaStatus.COMPLETED
    assert rt.output == {"won": "expired" if loser_by == "timer" else "stopped", "value": ""}
    assert kinds(rt).count("compensation_completed") == 1
    assert "compensation_started" not in [e.kind for e in rt.history]
    replays_the_same(rt)


def test_its_url_closes_and_a_late_call_changes_nothing() -> None:
    rt = start()
    accepted(rt, 1)
    rt.handle(TimerDue("sleep:1", at(15)))
    before = len(rt.history)
    with pytest.raises(CallbackGone):
        called_back(rt, 16, {"score": 3})
    assert len(rt.history) == before
    # The wait's own timer no longer wakes the saga: only the undo is awaited.
    assert WAIT not in rt.state.timers
    rt.handle(Reply(undo_id(rt), "success", at(17), {}))
    assert rt.status == SagaStatus.COMPLETED


def test_lost_while_its_request_is_in_flight_it_is_undone_as_a_kafka_step_is() -> None:
    rt = start()
    rt.handle(TimerDue("sleep:1", at(15)))  # before the service answered
    assert kinds(rt) == ["command_issued", "step_abandoned", "compensation_issued"]
    assert WAIT not in rt.state.callback_waits  # its URL is closed too
    with pytest.raises(CallbackGone):
        called_back(rt, 16, {"score": 3})
    late = rt.handle(Reply(request_id(rt), "success", at(16), {}))
    assert late.dropped is not None
    assert late.events == []
    rt.handle(Reply(undo_id(rt), "success", at(17), {}))
    assert rt.status == SagaStatus.COMPLETED
    replays_the_same(rt)


def test_the_winner_owes_nothing_at_once() -> None:
    rt = start()
    accepted(rt, 1)
    called_back(rt, 2, {"score": 7})
    assert rt.status == SagaStatus.COMPLETED
    assert rt.output == {"won": "scored", "value": "7"}
    assert kinds(rt) == ["command_issued", "reply_received"]
    replays_the_same(rt)


def test_a_timeout_scope_gives_it_up_the_same_way() -> None:
    rt = start(ScoreScope)
    accepted(rt, 1)
    rt.handle(TimerDue("scope:1", at(10)))
    assert kinds(rt) == ACCEPTED_THEN_GIVEN_UP
    [abandoned] = [e for e in rt.history if isinstance(e, StepAbandoned)]
    assert "ctx.timeout" in abandoned.reason
    rt.handle(Reply(undo_id(rt), "success", at(11), {}))
    assert rt.output == {"won": "timed out", "value": ""}
    replays_the_same(rt)


def test_while_the_saga_stops_it_stays_on_the_stack_and_the_unwind_undoes_it_once() -> None:
    rt = start()
    accepted(rt, 1)
    rt.handle(Cancel("no longer wanted", at(2)))
    assert "step_abandoned" not in kinds(rt)
    [started] = [e for e in rt.history if isinstance(e, CompensationStarted)]
    assert started.owed == ["fraud-check"]
    rt.handle(Reply(undo_id(rt), "success", at(3), {}))
    assert rt.status == SagaStatus.CANCELLED
    assert kinds(rt).count("compensation_issued") == 1
    replays_the_same(rt)


def test_a_history_recorded_before_the_rule_replays_as_it_ran() -> None:
    """Before this rule the accepted loser stayed on the stack and the saga completed
    without undoing it: no ``step_abandoned``, no compensation. It replays cleanly."""
    rt = start()
    accepted(rt, 1)
    rt.handle(TimerDue("sleep:1", at(15)))
    rt.handle(Reply(undo_id(rt), "success", at(16), {}))
    assert rt.status == SagaStatus.COMPLETED
    undo = undo_id(rt)
    old = [
        e
        for e in rt.history
        if e.kind not in ("step_abandoned", "compensation_issued", "compensation_completed")
        and getattr(e, "command_id", None) != undo
    ]
    assert [e.kind for e in old][-3:] == ["reply_received", "timer_fired", "saga_completed"]
    replays_the_same(rt, old)


def test_a_bare_callback_wait_that_loses_owes_nothing() -> None:
    """``ctx.callback``'s wait is no step: losing closes its URL and records nothing."""

    class Bare(Saga[Empty, Won]):
        name = "bare-callback-race"

        async def run(self, ctx: SagaContext, input: Empty) -> Won:
            cb = ctx.callback("verdict", model=Score, timeout=timedelta(hours=1))
            won = await ctx.first(verdict=cb.wait(), expired=ctx.sleep(timedelta(minutes=5)))
            return Won(won=won.name)

    rt = start(Bare)
    rt.handle(TimerDue("sleep:1", at(5)))
    assert rt.output == {"won": "expired", "value": ""}
    assert [e.kind for e in rt.history if e.kind.startswith(("step_", "compensation"))] == []
    with pytest.raises(CallbackGone):
        rt.handle(CallbackInput("callback:verdict:1", at(6), {"score": 1}, False, "d"))
    replays_the_same(rt)

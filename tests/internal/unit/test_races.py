"""Races (``ctx.first``) in the pure core and on the engine's one path: every order of
two inputs (a reply, a signal, a domain event, a timer), one after the other and both in
one batch. The first input in history wins, a replay from the stored JSON agrees, and a
step that lost after its command was sent is compensated exactly once (issue 41)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Signal, Winner
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import (
    Cancel,
    DropReason,
    EventInput,
    ForceCompensate,
    Inbound,
    Reply,
    Resume,
    RetryStep,
    SignalInput,
    Skip,
    StartSaga,
    TimerDue,
)
from saga_engine.core.history._events import (
    CommandIssued,
    CompensationIssued,
    Event,
    event_from_json,
    event_to_json,
)
from saga_engine.core.history._fold import Awaited
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.views._view import OwedState, saga_view_of
from saga_engine.runner._path_inputs import Deliver
from saga_engine.testing import SagaTestEnv
from tests.internal.unit.test_view_actions import accepted_inputs, offered
from tests.test_races import Charge, Empty, Hold, Refund, StuckUndo

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class Stop(BaseModel):
    why: str = ""


class PaymentCaptured(BaseModel):
    order_id: str
    receipt: str = "r-1"


class Won(BaseModel):
    won: str
    value: str = ""


class Racing(Saga[Empty, Won]):
    """A step, a signal, a domain event and a timer race; the saga ends with the winner
    once it is told to (so that what comes after the race finds it running)."""

    name = "racing"
    stop = Signal(Stop)
    close = Signal(Empty)

    async def run(self, ctx: SagaContext, input: Empty) -> Won:
        won = await ctx.first(
            charged=ctx.step("charge", to="payments", command=Charge(), compensate=Refund()),
            stopped=ctx.wait_signal(self.stop),
            paid=ctx.wait_event(PaymentCaptured, key="o-1"),
            expired=ctx.sleep(timedelta(minutes=15)),
        )
        await ctx.wait_signal(self.close)
        match won:
            case Winner("paid", PaymentCaptured() as paid):
                return Won(won="paid", value=paid.receipt)
            case Winner(name, _):
                return Won(won=name)
        raise AssertionError("unreachable")


DEFINITION = SagaDefinition.of(Racing)
RACERS = ("charged", "stopped", "paid", "expired")


def start() -> SagaRuntime:
    rt, _ = SagaRuntime.start(
        DEFINITION, StartSaga(saga_id="race-1", saga_type="racing", input={}, at=T0)
    )
    return rt


def command_of(history: list[Event], step: str, compensation: bool = False) -> str:
    kind = CompensationIssued if compensation else CommandIssued
    return next(e.command_id for e in history if isinstance(e, kind) and e.step == step)


def input_of(rt: SagaRuntime, racer: str, at: datetime) -> Inbound:
    if racer == "charged":
        return Reply(command_of(rt.history, "charge"), "success", at, {})
    if racer == "stopped":
        return SignalInput(signal_id=f"stop-{at.isoformat()}", name="stop", at=at)
    if racer == "paid":
        payload = {"order_id": "o-1", "receipt": "r-9"}
        return EventInput("PaymentCaptured", "o-1", f"ev-{at.isoformat()}", at, payload)
    return TimerDue("sleep:1", at)


def close(rt: SagaRuntime, at: datetime) -> None:
    rt.handle(SignalInput(signal_id="close", name="close", at=at))


def refund_reply(rt: SagaRuntime, at: datetime) -> Reply:
    return Reply(command_of(rt.history, "charge", compensation=True), "success", at, {})


def status_of(rt: SagaRuntime) -> SagaStatus:
    return rt.status  # (read again: not the status checked before the last input)


def round_trip(history: list[Event]) -> list[Event]:
    """The history as the store (and ``saga replay``'s files) keeps it: JSON."""
    return [event_from_json(event_to_json(e)) for e in history]


def replays_the_same(rt: SagaRuntime) -> None:
    again, decision = SagaRuntime.replay(DEFINITION, rt.saga_id, round_trip(rt.history))
    assert decision.nondeterminism is None
    assert decision.events == []  # nothing new: the same winner, the same refund
    assert again.status == rt.status
    assert again.output == rt.output
    again.close()


def kinds(rt: SagaRuntime, step: str) -> list[str]:
    return [e.kind for e in rt.history if getattr(e, "step", None) == step]


@pytest.mark.parametrize(("first", "second"), list(itertools.permutations(RACERS, 2)))
def test_of_two_inputs_the_first_in_history_wins(first: str, second: str) -> None:
    rt = start()
    rt.handle(input_of(rt, first, T0 + timedelta(minutes=1)))
    late = rt.handle(input_of(rt, second, T0 + timedelta(minutes=2)))
    if second == "stopped":
        assert late.dropped is None  # a signal is recorded (and kept for a later wait)
    else:
        assert late.dropped in (
            DropReason.DUPLICATE_REPLY,  # the charge was given up: its reply is late
            DropReason.NO_EVENT_WAIT,
            DropReason.STALE_TIMER,
        )
    if first != "charged":
        # The charge lost after its command was sent: in doubt, refunded at once.
        assert kinds(rt, "charge")[:3] == [
            "command_issued",
            "step_abandoned",
            "compensation_issued",
        ]
        rt.handle(refund_reply(rt, T0 + timedelta(minutes=3)))
    assert rt.status == SagaStatus.RUNNING
    close(rt, T0 + timedelta(minutes=4))
    assert status_of(rt) == SagaStatus.COMPLETED
    assert rt.output is not None
    assert rt.output["won"] == first
    refunds = kinds(rt, "charge").count("compensation_issued")
    assert refunds == (0 if first == "charged" else 1)
    if first == "paid":
        assert rt.output["value"] == "r-9"
    replays_the_same(rt)
    rt.close()


def test_a_late_reply_to_the_lost_step_changes_nothing() -> None:
    rt = start()
    rt.handle(input_of(rt, "expired", T0 + timedelta(minutes=15)))
    before = len(rt.history)
    late = rt.handle(input_of(rt, "charged", T0 + timedelta(minutes=16)))
    assert late.dropped == DropReason.DUPLICATE_REPLY
    assert late.events == []
    assert late.commands == []
    assert len(rt.history) == before
    rt.handle(refund_reply(rt, T0 + timedelta(minutes=17)))
    # A duplicate of the refund's answer, too: the compensation completed once.
    again = rt.handle(refund_reply(rt, T0 + timedelta(minutes=18)))
    assert again.dropped is not None
    assert kinds(rt, "charge").count("compensation_completed") == 1
    close(rt, T0 + timedelta(minutes=19))
    assert rt.output == {"won": "expired", "value": ""}
    replays_the_same(rt)


def test_the_losers_never_started_record_nothing() -> None:
    """A racer that finishes at once (a signal already kept) wins before the later ones
    are started: no command is sent for the charge, so there is nothing to refund."""

    class Buffered(Racing):
        name = "racing-buffered"

        async def run(self, ctx: SagaContext, input: Empty) -> Won:
            await ctx.sleep(timedelta(seconds=1))  # the signal arrives meanwhile
            won = await ctx.first(
                stopped=ctx.wait_signal(self.stop),
                charged=ctx.step("charge", to="payments", command=Charge(), compensate=Refund()),
                expired=ctx.sleep(timedelta(minutes=15)),
            )
            return Won(won=won.name)

    definition = SagaDefinition.of(Buffered)
    rt, _ = SagaRuntime.start(
        definition, StartSaga(saga_id="race-2", saga_type=Buffered.name, input={}, at=T0)
    )
    rt.handle(SignalInput(signal_id="s-1", name="stop", at=T0))
    rt.handle(TimerDue("sleep:1", T0 + timedelta(seconds=1)))
    assert rt.status == SagaStatus.COMPLETED
    assert rt.output == {"won": "stopped", "value": ""}
    assert [e.kind for e in rt.history if isinstance(e, CommandIssued)] == []
    assert [e.timer_id for e in rt.history if e.kind == "timer_started"] == ["sleep:1"]


# --------------------------------------------------------------------------- one batch


async def _racing_env() -> tuple[SagaTestEnv, str]:
    env = SagaTestEnv([Racing])
    env.participant("payments").on(Charge, no_reply=True)
    run = await env.start(Racing, Empty(), saga_id="race-batch")
    return env, run.saga_id


def _env_input(env: SagaTestEnv, saga_id: str, racer: str) -> Inbound:
    at = env.now()
    if racer == "charged":
        charge = env.commands("payments", compensation=False)[0]
        return Reply(charge.command_id, "success", at, {})
    if racer == "stopped":
        return SignalInput(signal_id="stop-1", name="stop", at=at)
    if racer == "paid":
        return EventInput("PaymentCaptured", "o-1", "ev-1", at, {"order_id": "o-1"})
    return TimerDue("sleep:1", at)


@pytest.mark.parametrize(("first", "second"), list(itertools.permutations(RACERS, 2)))
async def test_both_in_one_batch_the_first_recorded_wins(first: str, second: str) -> None:
    env, saga_id = await _racing_env()
    outcomes = await env.engine.apply(
        [Deliver(saga_id, _env_input(env, saga_id, r)) for r in (first, second)]
    )
    assert [o.error for o in outcomes] == [None, None]
    await env.settle()  # the refund goes out and is answered
    await env.signal(saga_id, "close", Empty())
    record = await env.engine.get(saga_id)
    assert record.status == SagaStatus.COMPLETED
    history = await env.engine.history(saga_id)
    assert history[-1].output["won"] == first  # type: ignore[union-attr]
    refunds = env.commands("payments", compensation=True)
    assert len(refunds) == (0 if first == "charged" else 1)
    # Recovered from the store by another engine: the same saga, nothing new.
    env.engine = env.new_engine([Racing])
    await env.engine.recover()
    assert len(await env.engine.history(saga_id)) == len(history)


# --------------------------------------------------------------------------- the view


def _operator_inputs(at: datetime) -> dict[tuple[str, str | None], Inbound]:
    out: dict[tuple[str, str | None], Inbound] = {
        ("signal", None): SignalInput("sig-9", "close", at, {}),
        ("cancel", None): Cancel("no longer wanted", at),
        ("force-compensate", None): ForceCompensate("by hand", at),
        ("resume", None): Resume(at),
    }
    for step in ("charge", "ship"):
        out["retry", step] = RetryStep(step, at)
        out["skip", step] = Skip(step, at)
    return out


async def _given_up(env: SagaTestEnv, refund: str) -> str:
    env.participant("payments").on(Charge, no_reply=True)
    if refund.startswith("in flight"):
        env.participant("payments").on(Refund, no_reply=True)
    else:
        env.participant("payments").on(Refund, reject="ledger closed")
    if refund == "in flight, the run failed":  # and nothing on its stack
        env.participant("shipping").on(Hold, reject="no route")
    run = await env.start(StuckUndo, Empty())
    await env.signal(run, "go", Empty())
    if refund.startswith("stuck"):
        await env.advance(timedelta(minutes=5))  # its back-off, then its second refusal
    if refund == "stuck, then cancelled":
        await env.cancel(run)
    if refund == "in flight, the run returned":
        await env.signal(run, "close", Empty())
    return run.saga_id


@pytest.mark.parametrize(
    "refund",
    [
        "in flight",
        "in flight, the run returned",
        "in flight, the run failed",
        "stuck",
        "stuck, then cancelled",
    ],
)
async def test_the_view_of_a_given_up_step_agrees_with_its_runtime(refund: str) -> None:
    env = SagaTestEnv([StuckUndo])
    saga_id = await _given_up(env, refund)
    history = await env.engine.history(saga_id)
    definition = env.parts.registry.get("stuck-undo")
    runtime, _ = SagaRuntime.replay(definition, saga_id, history)
    view = saga_view_of(history, saga_id=saga_id, awaited=runtime.awaited() or Awaited())
    # What is owed, in the order it would run: the refund under way first, then the stack.
    assert [o.step for o in view.owed] == runtime.owed_compensations()
    assert view.owed[0].step == "charge"
    expected = {
        "in flight": (SagaStatus.RUNNING, OwedState.COMPENSATING),
        "in flight, the run returned": (SagaStatus.RUNNING, OwedState.COMPENSATING),
        "in flight, the run failed": (SagaStatus.RUNNING, OwedState.COMPENSATING),
        "stuck": (SagaStatus.STEP_STUCK, OwedState.STUCK),
        "stuck, then cancelled": (SagaStatus.COMPENSATION_STUCK, OwedState.STUCK),
    }[refund]
    assert (view.status, view.owed[0].state) == expected
    if refund.startswith("stuck"):
        assert view.stuck_steps == ("charge",)
        assert any(w.step == "charge" and w.compensation for w in view.waiting_for)
    runtime.close()
    # The actions the view offers are exactly the inputs the runtime accepts.
    inputs = _operator_inputs(history[-1].at)
    assert offered(view) == accepted_inputs(definition, saga_id, history, inputs), refund
    assert (("cancel", None) in offered(view)) == (refund in ("in flight", "stuck"))

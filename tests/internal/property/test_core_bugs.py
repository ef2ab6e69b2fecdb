"""Minimal, deterministic reproductions of decision-core bugs the property tests found.

Each test states the behaviour the product promises; while the bug is there, it fails.
The property tests in ``test_runtime_properties.py`` find the same bugs from random runs.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from pydantic import BaseModel

from saga_engine import RetryPolicy, Saga, SagaContext
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import (
    Cancel,
    Decision,
    Reply,
    Resume,
    RetryStep,
    StartSaga,
    TimerDue,
)
from saga_engine.core.history._events import (
    CompensationIssued,
    Event,
    SagaCancelled,
    SagaCompensated,
    SagaFailed,
    SagaParked,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.runtime._runtime import SagaRuntime

T0 = datetime(2025, 1, 1, tzinfo=UTC)
S = SagaStatus


class In(BaseModel):
    n: int = 1


class Out(BaseModel):
    ok: bool = True


class Do(BaseModel):
    what: str
    n: int = 1


class Undo(BaseModel):
    what: str


class TimesOutThenWaits(Saga[In, Out]):
    """One step that may time out and is retried after a backoff."""

    name = "bug-backoff"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await ctx.step(
            "reserve",
            to="stock",
            command=Do(what="reserve", n=input.n),
            compensate=Undo(what="reserve"),
            retry=RetryPolicy(max_attempts=3),
            timeout=10,
        )
        return Out()


class SiblingFails(Saga[In, Out]):
    """Two parallel steps; one may time out and wait to retry while the other fails."""

    name = "bug-backoff-gather"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await asyncio.gather(
            ctx.step(
                "reserve",
                to="stock",
                command=Do(what="reserve"),
                compensate=Undo(what="reserve"),
                retry=RetryPolicy(max_attempts=3),
                timeout=10,
            ),
            ctx.step("charge", to="payments", command=Do(what="charge")),
        )
        return Out()


class StuckOnUndo(Saga[In, Out]):
    """A compensation that gets stuck after one refusal, then a failing step."""

    name = "bug-stuck"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await ctx.step(
            "reserve",
            to="stock",
            command=Do(what="reserve", n=input.n),
            compensate=Undo(what="reserve"),
            compensate_retry=RetryPolicy(max_attempts=1),
        )
        await ctx.step("charge", to="payments", command=Do(what="charge"))
        return Out()


class StuckOnUndoChanged(StuckOnUndo):
    """The same saga after a deploy that changed the first command's payload."""

    name = "bug-stuck"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await ctx.step("reserve", to="stock", command=Do(what="reserve", n=input.n + 1))
        return Out()


def _start(saga: type[Saga[In, Out]], saga_id: str) -> tuple[SagaRuntime, Decision]:
    definition = SagaDefinition.of(saga)
    return SagaRuntime.start(definition, StartSaga(saga_id, definition.name, {"n": 1}, T0))


def _timeout_timer(rt: SagaRuntime) -> tuple[str, datetime]:
    [(timer_id, fire_at)] = [
        (t, at) for t, at in rt.pending_timers().items() if t.startswith("timeout:")
    ]
    return timer_id, fire_at


# --------------------------------------------------------------------------- bug 1


def test_cancel_while_a_timed_out_step_waits_to_retry_compensates_it() -> None:
    """The step's first attempt timed out: it may have been applied. The saga is then
    cancelled during the retry backoff. Its compensation is owed (as it is when the
    cancel comes while the attempt is in flight, or when the last attempt times out)."""
    rt, _ = _start(TimesOutThenWaits, "b1")
    timer_id, fire_at = _timeout_timer(rt)
    rt.handle(TimerDue(timer_id, fire_at))  # attempt 1 timed out; a retry timer is armed
    assert any(t.startswith("retry:") for t in rt.pending_timers())

    decision = rt.handle(Cancel("customer gave up", fire_at + timedelta(milliseconds=1)))

    assert [e.step for e in decision.events if isinstance(e, CompensationIssued)] == ["reserve"]
    assert rt.status == S.COMPENSATING
    assert not any(isinstance(e, SagaCancelled) for e in decision.events)


def test_a_sibling_failing_while_a_timed_out_step_waits_to_retry_compensates_it() -> None:
    rt, started = _start(SiblingFails, "b1g")
    charge = next(c for c in started.commands if c.step == "charge")
    timer_id, fire_at = _timeout_timer(rt)
    rt.handle(TimerDue(timer_id, fire_at))  # reserve: attempt 1 timed out, waiting to retry

    decision = rt.handle(Reply(charge.command_id, "failure", fire_at, error="card declined"))

    assert not any(isinstance(e, SagaFailed) for e in decision.events), (
        "the saga failed with nothing compensated although 'reserve' may have been applied"
    )
    assert [e.step for e in decision.events if isinstance(e, CompensationIssued)] == ["reserve"]


# --------------------------------------------------------------------------- bug 2


def _stuck_then_parked() -> tuple[SagaDefinition, list[Event]]:
    rt, started = _start(StuckOnUndo, "b2")
    d = rt.handle(Reply(started.commands[0].command_id, "success", T0))
    d = rt.handle(Reply(d.commands[0].command_id, "failure", T0, error="no funds"))
    d = rt.handle(Reply(d.commands[0].command_id, "failure", T0, error="undo refused"))
    assert rt.status == S.COMPENSATION_STUCK
    # A deploy changes the code; rebuilding the saga parks it as nondeterministic.
    _, parked = SagaRuntime.replay(SagaDefinition.of(StuckOnUndoChanged), "b2", rt.history)
    assert [type(e) for e in parked.events] == [SagaParked]
    return SagaDefinition.of(StuckOnUndo), [*rt.history, *parked.events]


def test_resuming_a_stuck_saga_parked_by_a_bad_deploy_reports_compensating() -> None:
    definition, history = _stuck_then_parked()
    rt, _ = SagaRuntime.replay(definition, "b2", history)  # the fixed deploy
    assert rt.dead

    resumed = rt.handle(Resume(T0, "operator", "fixed the deploy"))

    # The resume re-sends the stuck compensation, so the saga is compensating again.
    assert [c.step for c in resumed.commands] == ["reserve"]
    assert rt.status == S.COMPENSATING, f"compensation in flight, but status is {rt.status}"


def test_a_stuck_saga_parked_by_a_bad_deploy_can_finish_compensating() -> None:
    definition, history = _stuck_then_parked()
    rt, _ = SagaRuntime.replay(definition, "b2", history)
    resumed = rt.handle(Resume(T0, "operator", "fixed the deploy"))

    # Today: RuntimeError("saga lifecycle crashed") from InvalidTransition
    # (compensation_stuck -> compensated), with the reply already appended to the history.
    done = rt.handle(Reply(resumed.commands[0].command_id, "success", T0))

    assert isinstance(done.events[-1], SagaCompensated)
    assert rt.status == S.COMPENSATED


# --------------------------------------------------------------------------- bug 3


def test_changed_code_does_not_park_a_completed_saga() -> None:
    """A completed saga's history replayed by changed code (as the engine does when a
    late reply arrives for an evicted saga) must stay completed: terminal states are final."""
    rt, started = _start(StuckOnUndo, "b3")
    d = rt.handle(Reply(started.commands[0].command_id, "success", T0))
    rt.handle(Reply(d.commands[0].command_id, "success", T0))
    assert rt.status == S.COMPLETED

    _, changed = SagaRuntime.replay(SagaDefinition.of(StuckOnUndoChanged), "b3", rt.history)
    assert changed.nondeterminism is not None  # reporting it is right...
    assert changed.events == [], "...but a saga_parked was recorded after saga_completed"

    # What the store would hold afterwards, rebuilt by the original (or any) code:
    fixed, _ = SagaRuntime.replay(SagaDefinition.of(StuckOnUndo), "b3", rt.history + changed.events)
    assert fixed.status == S.COMPLETED, f"the completed saga now reads {fixed.status}"


# --------------------------------------------------------------------------- minor


def test_saga_parked_is_not_stamped_before_the_history_it_ends() -> None:
    rt, started = _start(StuckOnUndo, "m1")
    late = T0 + timedelta(hours=2)
    rt.handle(Reply(started.commands[0].command_id, "success", late))
    _, changed = SagaRuntime.replay(SagaDefinition.of(StuckOnUndoChanged), "m1", rt.history)
    [parked] = changed.events
    assert parked.at >= rt.history[-1].at, (
        f"saga_parked at {parked.at} goes after an event at {rt.history[-1].at}"
    )


def test_owed_compensations_leaves_out_completed_ones() -> None:
    class TwoUndos(Saga[In, Out]):
        name = "minor-owed"

        async def run(self, ctx: SagaContext, input: In) -> Out:
            for step in ("a", "b"):
                await ctx.step(
                    step,
                    to="svc",
                    command=Do(what=step),
                    compensate=Undo(what=step),
                    compensate_retry=RetryPolicy(max_attempts=1),
                )
            await ctx.step("c", to="svc", command=Do(what="c"))
            return Out()

    rt, d = _start(TwoUndos, "m2")
    d = rt.handle(Reply(d.commands[0].command_id, "success", T0))
    d = rt.handle(Reply(d.commands[0].command_id, "success", T0))
    d = rt.handle(Reply(d.commands[0].command_id, "failure", T0))  # c fails: undo b, then a
    d = rt.handle(Reply(d.commands[0].command_id, "success", T0))  # b undone
    rt.handle(Reply(d.commands[0].command_id, "failure", T0))  # a's undo refused: stuck
    assert rt.status == S.COMPENSATION_STUCK
    assert rt.owed_compensations() == ["a"], "b was compensated already"


# --------------------------------------------------------------------------- bug 4
# Found by test_a_fixed_reply_model_accepts_held_replies_on_retry[prop-gather]:
# a retry_requested that a fixed deploy accepted replayed under the code that refuses the
# held reply without any nondeterminism being reported, when accepting it produced no
# intent at once (a gather's other step still in flight). The old code silently rebuilt
# the saga as step_stuck with the reply held again, although the history says the reply
# was accepted. docs/architecture.md promises: "a retry recorded under a fixed deploy does
# not replay under the broken one: that is nondeterminism, caught as such".


class Ack(BaseModel):
    outcome: str


class LenientAck(BaseModel):
    outcome: Any = None


class HeldPair(Saga[In, Out]):
    """Two parallel steps whose replies must match ``Ack``."""

    name = "bug-held-retry"
    ack: ClassVar[type[BaseModel]] = Ack

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await asyncio.gather(
            ctx.step("a", to="svc", command=Do(what="a"), returns=self.ack),
            ctx.step("b", to="svc", command=Do(what="b"), returns=self.ack),
        )
        return Out()


class HeldPairFixed(HeldPair):
    """The deploy that fixes the reply model: it reads any ``outcome``."""

    name = "bug-held-retry"
    ack = LenientAck


def test_a_retry_accepted_by_a_fixed_deploy_is_nondeterministic_under_the_old_code() -> None:
    rt, started = _start(HeldPair, "b4")
    a = next(c for c in started.commands if c.step == "a")
    rt.handle(Reply(a.command_id, "success", T0, payload={"outcome": 7}))  # held
    assert rt.status == S.STEP_STUCK

    fixed, _ = SagaRuntime.replay(SagaDefinition.of(HeldPairFixed), "b4", rt.history)
    accepted = fixed.handle(RetryStep("a", T0, "operator", "deployed the fix"))
    assert [e.kind for e in accepted.events] == ["retry_requested"]  # b is still in flight
    assert fixed.status == S.RUNNING

    # Rolled back (or rebuilt by an engine still on the old code): it cannot accept the
    # reply the history says was accepted.
    old, decision = SagaRuntime.replay(SagaDefinition.of(HeldPair), "b4", fixed.history)
    assert decision.nondeterminism is not None, (
        f"replayed cleanly as {old.status.value} with {old.held_steps()} held again"
    )
    assert old.status == S.NONDETERMINISTIC
    assert [e.kind for e in decision.events] == ["saga_parked"]

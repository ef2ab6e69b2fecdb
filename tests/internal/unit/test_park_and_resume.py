"""A parked saga: when ``saga_parked`` is stamped, and what error it reports after a resume."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pydantic import BaseModel

from saga_engine import Engine, RetryPolicy, Saga, SagaContext, SagaStatus, Settings
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import Decision, Reply, Resume, RetryStep, StartSaga
from saga_engine.core.history._events import Event, SagaParked
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.testing import SagaTestEnv

T0 = datetime(2025, 1, 1, tzinfo=UTC)


class Cmd(BaseModel):
    n: int


class Undo(BaseModel):
    n: int


class In(BaseModel):
    n: int = 1


class Out(BaseModel):
    ok: bool = True


class V1(Saga[In, Out]):
    name = "parkable"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await ctx.step(
            "a",
            to="p",
            command=Cmd(n=1),
            compensate=Undo(n=1),
            compensate_retry=RetryPolicy(max_attempts=1),
        )
        await ctx.step("b", to="p", command=Cmd(n=2))
        return Out()


class V2(Saga[In, Out]):
    """A deploy that renamed the first step: it no longer replays V1's histories."""

    name = "parkable"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await ctx.step("a-renamed", to="p", command=Cmd(n=1))
        await ctx.step("b", to="p", command=Cmd(n=2))
        return Out()


class WaitsUndeclared(Saga[In, Out]):
    """A bug: it waits for a signal it does not declare (parked, not compensated)."""

    name = "waits-undeclared"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await ctx.step("a", to="p", command=Cmd(n=1))
        await ctx.wait_signal("go")
        return Out()


def _start(saga: type[Saga[In, Out]], saga_id: str) -> tuple[SagaRuntime, Decision]:
    definition = SagaDefinition.of(saga)
    return SagaRuntime.start(definition, StartSaga(saga_id, definition.name, {"n": 1}, T0))


def _parked_by_v2(history: list[Event], now: datetime | None = None) -> list[Event]:
    """The history after a V2 deploy rebuilt the saga (at ``now``) and parked it."""
    _, parked = SagaRuntime.replay(SagaDefinition.of(V2), "s", history, now=now)
    assert [type(e) for e in parked.events] == [SagaParked]
    assert parked.projection.error is not None
    assert parked.projection.error["type"] == "NondeterminismError"
    return [*history, *parked.events]


# --------------------------------------------------------------------------- the stamp


def test_a_saga_parked_while_rebuilt_is_stamped_with_the_runners_clock() -> None:
    rt, started = _start(V1, "s")
    rt.handle(Reply(started.commands[0].command_id, "success", T0 + timedelta(minutes=1)))
    later = T0 + timedelta(hours=3)

    parked = _parked_by_v2(rt.history, now=later)[-1]

    assert parked.at == later, "parked when the engine rebuilt it, not at its last event"


def test_a_park_is_never_stamped_before_the_history_it_ends() -> None:
    rt, started = _start(V1, "s")
    last = T0 + timedelta(hours=1)
    rt.handle(Reply(started.commands[0].command_id, "success", last))
    # A clock behind the history (another host's), and a replay check without a clock.
    assert _parked_by_v2(rt.history, now=T0)[-1].at == last
    assert _parked_by_v2(rt.history)[-1].at == last


def test_a_saga_parked_while_handling_an_input_is_stamped_with_the_inputs_time() -> None:
    rt, started = _start(WaitsUndeclared, "s")
    late = T0 + timedelta(hours=2)

    decision = rt.handle(Reply(started.commands[0].command_id, "success", late))

    [_reply, parked] = decision.events
    assert isinstance(parked, SagaParked)
    assert parked.reason == "definition_error"
    assert parked.at == late


async def test_the_engine_parks_a_saga_it_recovers_at_its_clocks_time() -> None:
    env = SagaTestEnv([V1])
    env.participant("p").on(Cmd, no_reply=True)
    run = await env.start(V1, In())
    last = (await run.history())[-1].at
    await env.advance(timedelta(hours=6))

    broken = Engine(Settings(), sagas=[V2], store=env.store, sender=env.bus, clock=env.clock)
    assert await broken.recover() == 1

    parked = (await run.history())[-1]
    assert parked.kind == "saga_parked"
    assert parked.at == env.clock.now() == last + timedelta(hours=6)


# --------------------------------------------------------------------------- the error


def test_a_resumed_saga_that_completes_reports_no_error() -> None:
    rt, started = _start(V1, "s")
    history = _parked_by_v2(rt.history)
    fixed, _ = SagaRuntime.replay(SagaDefinition.of(V1), "s", history)
    assert fixed.dead

    resumed = fixed.handle(Resume(T0, "ops", "deployed the fix"))
    assert resumed.status == SagaStatus.RUNNING
    assert resumed.projection.error is None, "the park is over"
    a = fixed.handle(Reply(started.commands[0].command_id, "success", T0))
    done = fixed.handle(Reply(a.commands[0].command_id, "success", T0))
    assert done.status == SagaStatus.COMPLETED
    assert done.projection.error is None

    # Rebuilt from that history (saga_parked, saga_resumed, ..., saga_completed): the same.
    again, rebuilt = SagaRuntime.replay(SagaDefinition.of(V1), "s", fixed.history)
    assert rebuilt.events == []
    assert (rebuilt.status, rebuilt.projection.error) == (SagaStatus.COMPLETED, None)
    again.close()


def test_a_resumed_saga_that_parks_again_reports_the_new_park() -> None:
    rt, _ = _start(V1, "s")
    fixed, _ = SagaRuntime.replay(SagaDefinition.of(V1), "s", _parked_by_v2(rt.history))
    fixed.handle(Resume(T0, "ops", "deployed the fix"))

    _, again = SagaRuntime.replay(SagaDefinition.of(V2), "s", fixed.history)

    assert again.status == SagaStatus.NONDETERMINISTIC
    assert again.projection.error is not None
    assert again.projection.error["type"] == "NondeterminismError"


def test_a_resumed_compensation_reports_why_it_compensates_not_the_park() -> None:
    rt, started = _start(V1, "s")
    a = rt.handle(Reply(started.commands[0].command_id, "success", T0))
    undo = rt.handle(Reply(a.commands[0].command_id, "failure", T0, error="no stock"))
    stuck = rt.handle(Reply(undo.commands[0].command_id, "failure", T0, error="ledger locked"))
    assert stuck.status == SagaStatus.COMPENSATION_STUCK
    assert stuck.projection.error is not None
    assert stuck.projection.error["type"] == "CompensationStuck"
    fixed, _ = SagaRuntime.replay(SagaDefinition.of(V1), "s", _parked_by_v2(rt.history))

    resumed = fixed.handle(Resume(T0, "ops", "deployed the fix"))

    assert resumed.status == SagaStatus.COMPENSATING
    cause = resumed.projection.error
    assert cause is not None
    assert (cause["type"], cause["step"]) == ("StepFailed", "b"), "neither park nor stuck"
    done = fixed.handle(Reply(resumed.commands[0].command_id, "success", T0))
    assert (done.status, done.projection.error) == (SagaStatus.COMPENSATED, cause)


def test_a_stuck_compensation_resumed_or_retried_no_longer_reports_it_stuck() -> None:
    rt, started = _start(V1, "s")
    a = rt.handle(Reply(started.commands[0].command_id, "success", T0))
    undo = rt.handle(Reply(a.commands[0].command_id, "failure", T0, error="no stock"))
    rt.handle(Reply(undo.commands[0].command_id, "failure", T0, error="ledger locked"))

    resumed = rt.handle(Resume(T0, "ops", "unlocked the ledger"))
    assert resumed.status == SagaStatus.COMPENSATING
    assert resumed.projection.error is not None
    assert resumed.projection.error["type"] == "StepFailed"
    stuck = rt.handle(Reply(resumed.commands[0].command_id, "failure", T0, error="locked again"))
    assert stuck.projection.error is not None
    assert stuck.projection.error["type"] == "CompensationStuck"

    retried = rt.handle(RetryStep("a", T0, "ops", "unlocked it for good"))

    assert retried.status == SagaStatus.COMPENSATING
    assert retried.projection.error == resumed.projection.error
    done = rt.handle(Reply(retried.commands[0].command_id, "success", T0))
    assert (done.status, done.projection.error) == (
        SagaStatus.COMPENSATED,
        retried.projection.error,
    )

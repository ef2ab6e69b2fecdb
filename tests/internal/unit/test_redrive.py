"""§3 and §6 in the decision core: a step that parks when it cannot succeed (its policy,
or past the pivot), an operator's retry with an edited command or skip, and the pivot."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest
from pydantic import BaseModel

from saga_engine import (
    InvalidPayload,
    InvalidTransition,
    PastPivot,
    RetryPolicy,
    Saga,
    SagaContext,
    SagaStatus,
)
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.views._view import WaitKind, saga_view_of
from saga_engine.events import SagaParked
from saga_engine.testing import SagaTestEnv

PARK = RetryPolicy(max_attempts=2, initial_backoff=timedelta(0), on_exhausted="park")


class Cmd(BaseModel):
    n: int


class Undo(BaseModel):
    n: int


class Reply(BaseModel):
    n: int


class In(BaseModel):
    pivot: bool = False
    fail_after: bool = False


class Out(BaseModel):
    got: list[int] = []


class Three(Saga[In, Out]):
    """s1, then s2 (parks when it cannot succeed; the pivot if asked), then s3."""

    name = "three"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        got = []
        for i in (1, 2, 3):
            reply = await ctx.step(
                f"s{i}",
                to=f"p{i}",
                command=Cmd(n=i),
                compensate=Undo(n=i),
                returns=Reply,
                retry=PARK if i == 2 else RetryPolicy(max_attempts=1),
                pivot=input.pivot and i == 2,
            )
            got.append(reply.n)
            if input.fail_after and i == 2:
                raise RuntimeError("a bug after the pivot")
        return Out(got=got)


async def _replays_cleanly(env: SagaTestEnv, saga_id: str) -> None:
    definition = env.parts.registry.get("three")
    runtime, decision = SagaRuntime.replay(definition, saga_id, await env.engine.history(saga_id))
    assert decision.nondeterminism is None
    assert decision.events == []
    runtime.close()


def _env() -> SagaTestEnv:
    env = SagaTestEnv([Three])
    for i in (1, 2, 3):
        env.participant(f"p{i}").on(Cmd, reply={"n": i})
    return env


def _kinds(history: Sequence[object]) -> list[str]:
    return [e.kind for e in history]  # type: ignore[attr-defined]


async def test_exhausted_step_parks_holding_its_stack_and_a_retry_sends_an_edited_command() -> None:
    env = _env()
    env.participant("p2").on(Cmd, retryable="address unknown", times=2)
    run = await env.start(Three, In())
    assert await env.run_until_settled(run) == SagaStatus.STEP_STUCK
    history = await run.history()
    parked = next(e for e in history if e.kind == "step_parked")
    assert parked.step == "s2"
    assert parked.error.type == "StepParked"
    assert "gave up after 2 attempts: address unknown" in parked.error.message
    assert env.compensated_steps() == []  # held, not compensated
    view = saga_view_of(history, saga_id=run.saga_id)
    assert [w.kind for w in view.waiting_for] == [WaitKind.OPERATOR]
    assert "parked" in view.waiting_for[0].what
    actions = {a.name: a.steps for a in view.actions}
    assert actions["retry"] == ("s2",)
    assert actions["skip"] == ("s2",)
    # A command its model refuses is a clear error, and nothing is recorded.
    with pytest.raises(InvalidPayload, match="n"):
        await env.engine.retry_step(run.saga_id, "s2", command={"n": "many"})
    with pytest.raises(InvalidTransition, match="could not succeed and wait for an operator"):
        await env.engine.resume(run.saga_id)
    with pytest.raises(InvalidTransition, match="only for a step parked"):
        await env.engine.retry_step(run.saga_id, "s1", command={"n": 5})
    assert len(await run.history()) == len(history)
    await env.engine.retry_step(
        run.saga_id, "s2", command={"n": 20}, principal="ana", reason="fixed the address"
    )
    await env.settle()
    assert await run.status() == SagaStatus.COMPLETED
    history = await run.history()
    retry = next(e for e in history if e.kind == "retry_requested")
    assert (retry.command, retry.principal, retry.reason) == ({"n": 20}, "ana", "fixed the address")
    sent = [e for e in history if e.kind == "command_issued" and e.step == "s2"]
    assert [e.payload for e in sent] == [{"n": 2}, {"n": 2}, {"n": 20}]  # the original kept
    assert len({e.command_id for e in sent}) == 3  # retryable, then edited: new ids each
    assert env.commands("p2")[-1].payload == {"n": 20}
    await _replays_cleanly(env, run.saga_id)


async def test_a_refused_parked_step_retried_as_it_was_goes_under_a_new_id() -> None:
    env = _env()
    env.participant("p2").on(Cmd, reject="card declined", times=1)
    run = await env.start(Three, In())
    assert await env.run_until_settled(run) == SagaStatus.STEP_STUCK
    await env.engine.retry_step(run.saga_id, "s2")
    await env.settle()
    assert await run.status() == SagaStatus.COMPLETED
    sent = [e for e in await run.history() if e.kind == "command_issued" and e.step == "s2"]
    assert [e.payload for e in sent] == [{"n": 2}, {"n": 2}]
    assert sent[0].command_id != sent[1].command_id
    await _replays_cleanly(env, run.saga_id)


async def test_a_parked_step_skipped_with_a_result_goes_on_and_a_cancel_compensates() -> None:
    env = _env()
    env.participant("p2").on(Cmd, retryable="down")
    run = await env.start(Three, In())
    assert await env.run_until_settled(run) == SagaStatus.STEP_STUCK
    with pytest.raises(InvalidPayload):
        await env.engine.skip_step(run.saga_id, "s2", {"wrong": 1})
    await env.engine.skip_step(run.saga_id, "s2", {"n": 7}, principal="bo")
    await env.settle()
    assert await run.status() == SagaStatus.COMPLETED
    assert (await run.output()).got == [1, 7, 3]  # type: ignore[attr-defined]
    # Another one parks, then is cancelled: the stack it held is unwound.
    other = await env.start(Three, In(), idempotency_key="second")
    assert await env.run_until_settled(other) == SagaStatus.STEP_STUCK
    await env.engine.cancel(other.saga_id, "customer gave up")
    await env.settle()
    assert await other.status() == SagaStatus.CANCELLED
    assert env.compensated_steps() == ["s1"]
    await _replays_cleanly(env, other.saga_id)


async def test_past_the_pivot_a_cancel_is_refused_and_a_refused_step_parks() -> None:
    env = _env()
    env.participant("p3").on(Cmd, reject="warehouse closed", times=1)
    run = await env.start(Three, In(pivot=True))
    # s3 has the default policy (compensate), but the saga is past its pivot: it parks.
    assert await env.run_until_settled(run) == SagaStatus.STEP_STUCK
    history = await run.history()
    assert _kinds(history).count("pivot_passed") == 1
    parked = next(e for e in history if e.kind == "step_parked")
    assert (parked.step, parked.past_pivot) == ("s3", True)
    view = saga_view_of(history, saga_id=run.saga_id)
    assert (view.pivot_step, view.past_pivot) == ("s2", True)
    assert "cancel" not in {a.name for a in view.actions}
    with pytest.raises(PastPivot, match="past its pivot"):
        await env.engine.cancel(run.saga_id, "too late")
    with pytest.raises(PastPivot, match="past its pivot"):
        await env.engine.force_compensate(run.saga_id, "too late")
    assert len(await run.history()) == len(history)
    await env.engine.retry_step(run.saga_id, "s3")
    await env.settle()
    assert await run.status() == SagaStatus.COMPLETED
    assert env.compensated_steps() == []
    await _replays_cleanly(env, run.saga_id)


async def test_before_the_pivot_passes_it_compensates_as_usual() -> None:
    env = _env()
    env.participant("p2").on(Cmd, no_reply=True)
    run = await env.start(Three, In(pivot=True))
    view = saga_view_of(await run.history(), saga_id=run.saga_id)
    assert (view.pivot_step, view.past_pivot) == ("s2", False)
    await env.engine.cancel(run.saga_id, "changed my mind")
    await env.settle()
    assert await run.status() == SagaStatus.CANCELLED
    assert env.compensated_steps() == ["s2", "s1"]


async def test_a_run_that_fails_past_its_pivot_is_parked_not_compensated() -> None:
    env = _env()
    run = await env.start(Three, In(pivot=True, fail_after=True))
    assert await env.run_until_settled(run) == SagaStatus.NONDETERMINISTIC
    parked = (await run.history())[-1]
    assert parked.kind == "saga_parked"
    assert parked.error.type == "FailedPastPivot"
    assert "a bug after the pivot" in parked.error.message
    assert env.compensated_steps() == []


class Timed(Saga[In, Out]):
    """s1, then the pivot s2, then s3 whose attempts time out (it parks, in doubt)."""

    name = "timed"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        got = []
        for i in (1, 2, 3):
            reply = await ctx.step(
                f"s{i}",
                to=f"p{i}",
                command=Cmd(n=i),
                compensate=Undo(n=i),
                returns=Reply,
                timeout=10,
                retry=RetryPolicy(max_attempts=1),
                pivot=input.pivot and i == 2,
            )
            got.append(reply.n)
        return Out(got=got)


async def test_past_the_pivot_the_deadline_no_longer_applies_and_the_timeline_shows_it() -> None:
    env = SagaTestEnv([Timed])
    for i in (1, 2):
        env.participant(f"p{i}").on(Cmd, reply={"n": i})
    env.participant("p3").on(Cmd, no_reply=True)
    run = await env.start(Timed, In(pivot=True), deadline=timedelta(minutes=1))
    await env.advance(timedelta(seconds=11))  # s3's only attempt times out: it parks
    assert await run.status() == SagaStatus.STEP_STUCK
    await env.advance(timedelta(minutes=5))  # the deadline passes: nothing happens
    assert await run.status() == SagaStatus.STEP_STUCK
    history = await run.history()
    assert "cancel_requested" not in _kinds(history)
    parked = next(e for e in history if e.kind == "step_parked")
    assert parked.in_doubt
    view = saga_view_of(history, saga_id=run.saga_id)
    labels = {(seg.label, seg.outcome) for seg in view.segments}
    assert ("pivot s2", "pivot") in labels
    assert ("s3 parked", "parked") in labels
    # Past its pivot a saga goes forward only: no compensation can still run, so none
    # is listed as owed (issue 39 §8.5: what is listed is what can still happen).
    assert list(view.owed) == []
    # Skipped by hand while in doubt, the saga goes on forward and completes.
    await env.engine.skip_step(run.saga_id, "s3", {"n": 33}, principal="bo")
    await env.settle()
    assert await run.status() == SagaStatus.COMPLETED


async def test_a_second_pivot_is_a_definition_error() -> None:
    class TwoPivots(Saga[In, Out]):
        name = "two-pivots"

        async def run(self, ctx: SagaContext, input: In) -> Out:
            await ctx.step("a", to="p1", command=Cmd(n=1), pivot=True)
            await ctx.step("b", to="p1", command=Cmd(n=2), pivot=True)
            return Out()

    env = SagaTestEnv([TwoPivots])
    run = await env.start(TwoPivots, In())
    assert await env.run_until_settled(run) == SagaStatus.NONDETERMINISTIC
    parked = (await run.history())[-1]
    assert isinstance(parked, SagaParked)
    assert "a second pivot" in parked.error.message


async def test_the_shared_empty_parked_steps_is_never_written() -> None:
    from saga_engine.core.history._fold import NO_PARKED

    env = _env()
    env.participant("p2").on(Cmd, retryable="down")
    runs = [await env.start(Three, In(), idempotency_key=str(i)) for i in range(2)]
    for run in runs:
        assert await env.run_until_settled(run) == SagaStatus.STEP_STUCK
    assert NO_PARKED == {}

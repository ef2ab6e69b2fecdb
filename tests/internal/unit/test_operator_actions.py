"""Operator actions that know the compensation stack: force-compensate, skip, retry."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel

from saga_engine import InvalidTransition, RetryPolicy, Saga, SagaContext, SagaStatus
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.testing import SagaTestEnv


class Cmd(BaseModel):
    n: int


class Undo(BaseModel):
    n: int


class In(BaseModel):
    pass


class Out(BaseModel):
    got: list[int] = []


class Three(Saga[In, Out]):
    name = "three"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        got = []
        for i in (1, 2, 3):
            reply = await ctx.step(
                f"s{i}",
                to=f"p{i}",
                command=Cmd(n=i),
                compensate=Undo(n=i),
                timeout=10,
                retry=RetryPolicy(
                    max_attempts=3,
                    initial_backoff=timedelta(minutes=5),
                    max_backoff=timedelta(minutes=5),
                ),
                compensate_retry=RetryPolicy(max_attempts=1),
            )
            got.append(int(reply.get("n", 0)))
        return Out(got=got)


async def _replays_cleanly(env: SagaTestEnv, saga_id: str) -> None:
    definition = env.parts.registry.get("three")
    runtime, decision = SagaRuntime.replay(definition, saga_id, await env.engine.history(saga_id))
    assert decision.nondeterminism is None
    assert decision.events == []
    runtime.close()


async def test_force_compensate_undoes_the_applied_steps() -> None:
    env = SagaTestEnv([Three])
    env.participant("p3").on(Cmd, no_reply=True)
    run = await env.start(Three, In())
    await env.engine.force_compensate(run.saga_id, "order withdrawn by support", principal="ana")
    await env.settle()
    assert await run.status() == SagaStatus.COMPENSATED
    # s3 was in flight (outcome unknown), so it is compensated too, first.
    assert env.compensated_steps() == ["s3", "s2", "s1"]
    history = await run.history()
    forced = next(e for e in history if e.kind == "compensation_forced")
    assert forced.principal == "ana"
    started = next(e for e in history if e.kind == "compensation_started")
    assert started.reason == "operator"
    with pytest.raises(InvalidTransition, match="compensated; it accepts no force-compensate"):
        await env.engine.force_compensate(run.saga_id, "again")
    await _replays_cleanly(env, run.saga_id)


async def test_skip_answers_a_waiting_step_and_it_is_not_compensated_later() -> None:
    env = SagaTestEnv([Three])
    env.participant("p2").on(Cmd, no_reply=True)
    env.participant("p3").on(Cmd, reject="no")
    run = await env.start(Three, In())
    with pytest.raises(InvalidTransition, match=r"steps waiting for a reply: \['s2'\]"):
        await env.engine.skip_step(run.saga_id, "s1", {"n": 1})
    await env.engine.skip_step(run.saga_id, "s2", {"n": 22}, reason="done by hand", principal="bo")
    await env.settle()
    assert await run.status() == SagaStatus.COMPENSATED
    # s3 refused; s2 was answered by an operator, so only s1 is compensated.
    assert env.compensated_steps() == ["s1"]
    skipped = next(e for e in await run.history() if e.kind == "step_skipped")
    assert (skipped.step, skipped.payload, skipped.principal) == ("s2", {"n": 22}, "bo")
    await _replays_cleanly(env, run.saga_id)


async def test_skip_marks_a_stuck_compensation_done_and_the_rest_continue() -> None:
    env = SagaTestEnv([Three])
    env.participant("p3").on(Cmd, reject="no")
    env.participant("p2").on(Undo, reject="ledger locked")
    run = await env.start(Three, In())
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATION_STUCK
    with pytest.raises(InvalidTransition, match="the stuck compensation is 's2'"):
        await env.engine.skip_step(run.saga_id, "s1")
    await env.engine.skip_step(run.saga_id, "s2", reason="released by hand")
    await env.settle()
    assert await run.status() == SagaStatus.COMPENSATED
    assert env.compensated_steps() == ["s2", "s1"]
    assert len(env.commands("p1", compensation=True)) == 1
    await _replays_cleanly(env, run.saga_id)


async def test_retry_now_cuts_the_back_off_short() -> None:
    env = SagaTestEnv([Three])
    env.participant("p1").on(Cmd, retryable="busy", times=1)
    run = await env.start(Three, In())
    assert len(env.commands("p1")) == 1  # waiting five minutes before the next attempt
    with pytest.raises(InvalidTransition, match=r"can be neither retried nor re-sent.*skip"):
        await env.engine.retry_step(run.saga_id, "s2")
    await env.engine.retry_step(run.saga_id, "s1", principal="cy")
    await env.settle()
    assert len(env.commands("p1")) == 2
    assert await run.status() == SagaStatus.COMPLETED
    await _replays_cleanly(env, run.saga_id)


async def test_retry_re_sends_a_step_waiting_for_its_reply_under_its_id() -> None:
    env = SagaTestEnv([Three])
    env.participant("p1").on(Cmd, no_reply=True, times=1)
    run = await env.start(Three, In())
    assert len(env.commands("p1")) == 1  # lost: the saga waits for its reply
    await env.engine.retry_step(run.saga_id, "s1", principal="cy", reason="lost in transit")
    await env.settle()
    sent = env.commands("p1")
    assert len(sent) == 2
    assert sent[0].command_id == sent[1].command_id  # the participant deduplicates it
    assert await run.status() == SagaStatus.COMPLETED
    retried = [e for e in await run.history() if e.kind == "retry_requested"]
    assert [(e.step, e.principal, e.reason) for e in retried] == [("s1", "cy", "lost in transit")]
    await _replays_cleanly(env, run.saga_id)


async def test_retry_of_a_stuck_compensation_sends_it_again() -> None:
    env = SagaTestEnv([Three])
    env.participant("p3").on(Cmd, reject="no")
    env.participant("p2").on(Undo, reject="ledger locked", times=1)
    run = await env.start(Three, In())
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATION_STUCK
    await env.engine.retry_step(run.saga_id, "s2")
    await env.settle()
    assert await run.status() == SagaStatus.COMPENSATED
    assert len(env.commands("p2", compensation=True)) == 2
    await _replays_cleanly(env, run.saga_id)

"""A parent waits for a long-running child: its wait survives any number of polls and
records nothing while nothing happens (issue 39, 8.3)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus
from saga_engine.core.history._decision import CHILD_PARTICIPANT, child_saga_id
from saga_engine.testing import SagaTestEnv


class Number(BaseModel):
    i: int


class Slow(Saga[Number, Number]):
    name = "slow"

    async def run(self, ctx: SagaContext, input: Number) -> Number:
        await ctx.sleep(timedelta(days=4))
        return Number(i=input.i + 1)


class Parent(Saga[Number, Number]):
    name = "parent"

    async def run(self, ctx: SagaContext, input: Number) -> Number:
        return await ctx.child(Slow, input)


async def test_a_parent_outlives_a_child_of_four_days() -> None:
    # Its 1,025th poll of the child overflowed the back-off and failed it.
    env = SagaTestEnv([Parent, Slow])
    run = await env.start(Parent, Number(i=1))
    await env.advance(timedelta(days=4, hours=1))
    assert await run.status() == SagaStatus.COMPLETED, await run.error()
    assert (await run.output()).model_dump() == {"i": 2}


async def test_a_parent_records_little_while_its_child_runs() -> None:
    env = SagaTestEnv([Parent, Slow])
    run = await env.start(Parent, Number(i=1))
    await env.advance(timedelta(days=4, hours=1))
    assert await run.status() == SagaStatus.COMPLETED
    kinds = Counter(e.kind for e in await run.history())
    assert sum(kinds.values()) < 20, kinds


class Quick(Saga[Number, Number]):
    name = "quick"

    async def run(self, ctx: SagaContext, input: Number) -> Number:
        return Number(i=input.i * 10)


class QuickParent(Saga[Number, Number]):
    name = "quick-parent"

    async def run(self, ctx: SagaContext, input: Number) -> Number:
        return await ctx.child(Quick, input, poll=timedelta(minutes=5))


async def test_a_lost_start_is_sent_again_by_the_poll_and_nothing_is_recorded() -> None:
    env = SagaTestEnv([QuickParent, Quick])
    env.hold(lambda c: c.participant == CHILD_PARTICIPANT)
    run = await env.start(QuickParent, Number(i=4))
    [lost] = env.held
    env.held.clear()  # the start never reaches an engine that runs quick sagas
    env.hold(lambda c: False)
    before = [e.kind for e in await run.history()]
    await env.advance(timedelta(minutes=4))
    assert await run.status() == SagaStatus.RUNNING
    await env.advance(timedelta(minutes=2))  # the poll asks again: same command, same id
    assert await run.status() == SagaStatus.COMPLETED
    assert (await run.output()).model_dump() == {"i": 40}
    starts = env.commands(CHILD_PARTICIPANT)
    assert [(c.command_id, c.attempt) for c in starts] == [(lost.command_id, 1)] * 2
    kinds = [e.kind for e in await run.history()]
    assert kinds == [*before, "reply_received", "saga_completed"]


async def test_a_parent_asks_its_running_child_again_at_each_poll() -> None:
    env = SagaTestEnv([Parent, Slow])
    run = await env.start(Parent, Number(i=1))
    recorded = len(await run.history())
    await env.advance(timedelta(hours=1))
    starts = env.commands(CHILD_PARTICIPANT)
    assert len(starts) == 1 + 12  # the first send, then one per 5-minute poll
    assert len({c.command_id for c in starts}) == 1
    assert len(await run.history()) == recorded
    child = child_saga_id(run.saga_id, "slow")
    assert len(await env.engine.history(child)) == 2  # started, its sleep: asked, not restarted

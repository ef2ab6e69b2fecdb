"""One view rule: what a saga's view lists as awaited or owed is what can still happen
(issue 39, 8.5). The loser of an ``asyncio.wait(..., FIRST_COMPLETED)`` race, which the
code gave up, is no longer awaited (its history records the wait, not its end; a step
given up is recorded, and refunded at once: issue 41); a saga
past its pivot owes no compensation, since it only goes forward from there."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Signal
from saga_engine.admin._views import awaited, view_of
from saga_engine.core.views._view import WaitKind, saga_view_of
from saga_engine.testing import SagaTestEnv


class Empty(BaseModel):
    pass


class Charge(BaseModel):
    n: int = 1


class Refund(BaseModel):
    n: int = 1


class Race(Saga[Empty, Empty]):
    """Payment against a cancel against a timeout; the losers are cancelled."""

    name = "race"
    paid = Signal(Empty)
    cancel = Signal(Empty)
    close = Signal(Empty)

    async def run(self, ctx: SagaContext, input: Empty) -> Empty:
        paid = asyncio.ensure_future(ctx.wait_signal(Race.paid, timeout=timedelta(hours=2)))
        cancel = asyncio.ensure_future(ctx.wait_signal(Race.cancel))
        charge = asyncio.ensure_future(
            ctx.step("charge", to="payments", command=Charge(), compensate=Refund())
        )
        window = asyncio.ensure_future(ctx.sleep(timedelta(hours=1)))
        _, pending = await asyncio.wait(
            {paid, cancel, charge, window}, return_when=asyncio.FIRST_COMPLETED
        )
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await ctx.wait_signal(Race.close)
        return Empty()


async def test_the_losers_of_a_race_are_not_listed_as_awaited() -> None:
    env = SagaTestEnv([Race])
    env.participant("payments").on(Charge, no_reply=True)
    run = await env.start(Race, Empty())
    await env.advance(timedelta(hours=3))  # the window won; the paid wait's deadline passed
    assert await run.status() == SagaStatus.RUNNING
    record = await env.engine.get(run.saga_id)
    events = await run.history()
    view = view_of(record, events, awaited(env.parts.registry, record, events))
    assert [(w.kind, w.name) for w in view.waiting_for] == [(WaitKind.SIGNAL, "close")]
    assert view.in_flight == ()
    assert view.timers == ()
    # The charge may have been applied (no answer came): given up, it was refunded at
    # once (issue 41), not left owed to an unwind that may never come.
    assert view.owed == ()
    assert [c.step for c in env.commands("payments", compensation=True)] == ["charge"]
    assert [e.kind for e in events if e.kind == "step_abandoned"] == ["step_abandoned"]
    # Across a restart: the history replayed says the same.
    env.engine = env.new_engine([Race])
    await env.engine.recover()
    again = view_of(record, events, awaited(env.parts.registry, record, events))
    assert again.waiting_for == view.waiting_for


class Step(BaseModel):
    n: int


class Pivoting(Saga[Empty, Empty]):
    name = "pivoting"

    async def run(self, ctx: SagaContext, input: Empty) -> Empty:
        await ctx.step("reserve", to="stock", command=Step(n=1), compensate=Refund())
        await ctx.step("capture", to="payments", command=Step(n=2), pivot=True)
        await ctx.step("ship", to="shipping", command=Step(n=3), compensate=Refund())
        return Empty()


async def test_a_saga_past_its_pivot_owes_no_compensation() -> None:
    env = SagaTestEnv([Pivoting])
    env.participant("shipping").on(Step, no_reply=True)
    run = await env.start(Pivoting, Empty())
    assert await run.status() == SagaStatus.RUNNING
    view = saga_view_of(await run.history(), saga_id=run.saga_id)
    assert view.past_pivot
    assert view.owed == ()  # reserve can never be refunded, nor ship
    runtime = env.engine.runtime_of(run.saga_id)
    assert runtime is not None
    assert runtime.owed_compensations() == []


async def test_before_its_pivot_a_saga_owes_its_compensations() -> None:
    env = SagaTestEnv([Pivoting])
    env.participant("payments").on(Step, no_reply=True)
    run = await env.start(Pivoting, Empty())
    view = saga_view_of(await run.history(), saga_id=run.saga_id)
    assert not view.past_pivot
    assert [o.step for o in view.owed] == ["reserve"]

"""What an engine keeps per saga: an evicted saga is freed by reference counting (no
cycle waits for a full garbage collection, which a tuned service seldom runs), and a
per-saga lock lives only while held or awaited."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from datetime import timedelta

import pytest
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, Signal
from saga_engine.core.runtime._loop import DeterministicLoop
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.runtime._state import SagaState
from saga_engine.runner._cache import KeyedLocks
from saga_engine.testing import SagaTestEnv


class Empty(BaseModel):
    pass


class Go(BaseModel):
    pass


class Waits(Saga[Empty, Empty]):
    name = "waits"
    go = Signal(Go)

    async def run(self, ctx: SagaContext, input: Empty) -> Empty:
        await ctx.wait_signal("go")
        return Empty()


class CleansUp(Saga[Empty, Empty]):
    """Awaits a ctx operation in a finally block: evicting it runs that block."""

    name = "cleans-up"
    go = Signal(Go)

    async def run(self, ctx: SagaContext, input: Empty) -> Empty:
        try:
            await ctx.wait_signal("go")
        finally:
            await ctx.sleep(timedelta(seconds=1))
        return Empty()


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_evicted_sagas_leave_no_cycles(no_collector: None) -> None:
    env = SagaTestEnv([Waits])
    ids = [await env.engine.start(Waits, Empty()) for _ in range(20)]
    assert len(env.parts.live) == 20
    runtimes = [env.engine.runtime_of(i) for i in ids]
    loops = {id(rt.state.loop) for rt in runtimes if rt is not None}
    assert len(loops) == 20
    for saga_id in ids:
        env.engine.evict(saga_id)
    del runtimes
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        # What other tests left behind may be in the garbage too: only these sagas count.
        kept = [
            o
            for o in gc.garbage
            if (isinstance(o, SagaRuntime | SagaState) and o.saga_id in ids)
            or (isinstance(o, DeterministicLoop) and id(o) in loops)
            or (isinstance(o, asyncio.Task) and id(o.get_loop()) in loops)
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    # Nothing of theirs was left for the collector: reference counting freed it all.
    assert kept == []
    # And an evicted saga still goes on when its input comes.
    await env.engine.signal(ids[0], "go", {})
    assert (await env.engine.get(ids[0])).status.value == "completed"


async def test_a_lock_lives_only_while_held_or_awaited() -> None:
    locks = KeyedLocks()
    await locks.acquire("a")
    waiter = asyncio.get_running_loop().create_task(locks.acquire("a"))
    await asyncio.sleep(0)  # the waiter queues on the held lock
    assert locks.held("a")
    locks.release("a")
    await waiter  # handed over, not dropped: the waiter holds it now
    assert locks.held("a")
    locks.release("a")
    assert not locks.held("a")
    assert len(locks) == 0
    # A waiter cancelled while queued gives its place back too.
    await locks.acquire("b")
    cancelled = asyncio.get_running_loop().create_task(locks.acquire("b"))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    locks.release("b")
    assert len(locks) == 0


async def test_a_waiter_cancelled_as_the_lock_is_handed_to_it_passes_it_on() -> None:
    locks = KeyedLocks()
    await locks.acquire("a")
    loop = asyncio.get_running_loop()
    first = loop.create_task(locks.acquire("a"))
    second = loop.create_task(locks.acquire("a"))
    await asyncio.sleep(0)  # both queue, in order
    locks.release("a")  # handed to the first...
    first.cancel()  # ...which is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await first
    await second  # passed on, in order, not dropped
    assert locks.held("a")
    locks.release("a")
    assert len(locks) == 0


async def test_evicting_a_saga_whose_finally_awaits_is_quiet_and_it_goes_on() -> None:
    env = SagaTestEnv([CleansUp])
    saga_id = await env.engine.start(CleansUp, Empty())
    runtime = env.engine.runtime_of(saga_id)
    assert runtime is not None
    # Closing runs the finally block, whose sleep fails (the saga is being dropped):
    # that must not escape into whoever evicts (the housekeeping loop, a rebalance).
    assert env.engine.evict_idle(0, 0) == 1
    runtime.close()  # twice (the batch path may drop a saga twice): a no-op
    history = [e.kind for e in await env.engine.history(saga_id)]
    assert "timer_started" not in history  # nothing the finally block tried was recorded
    await env.engine.signal(saga_id, "go", {})
    await env.advance(timedelta(seconds=2))
    assert (await env.engine.get(saga_id)).status.value == "completed"

"""Memory per resident saga: ``k`` sagas waiting for their first step's reply, resident
in an in-memory engine (``SagaTestEnv``; the commands kept in flight and then
forgotten, so no reply comes). Python's allocations are traced (``tracemalloc``) with
the ``k`` sagas resident, and again after the engine evicted them (their histories
stay in the in-memory store, as they would stay in Postgres): the difference over ``k``
is what a waiting saga costs an engine process. ``with_history_bytes_per_saga`` also
counts the in-memory store's copy of its history.

``floor_bytes_per_resident_saga``, a ceiling measured in the same run: the same saga as
a bare coroutine (``bench.ir.coroutine_floor``) on a deterministic loop of its own,
holding what the saga's code holds (its input as it came and as its model, its first
step's command and compensation as models and as dumps) and waiting on a future for
the reply; nothing of the runtime or the engine. What any engine that keeps a waiting
saga as a coroutine and its models as pydantic must hold."""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

from bench.ir.coroutine_floor import started
from bench.ir.shape import SAGAS, Order, saga_of
from saga_engine.kernel._mainloop import run as run_loop
from saga_engine.testing import SagaTestEnv


async def measure(k: int) -> dict[str, int]:
    env = SagaTestEnv(list(SAGAS))
    env.hold(lambda _: True)
    # One saga first, so that what is allocated once (caches, the first saga's imports,
    # the definitions' lazily built parts) is not counted.
    await env.start(saga_of(0), Order(n=-1))
    env.held.clear()
    env.bus.sent.clear()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ids = []
    for n in range(k):
        run = await env.start(saga_of(n), Order(n=n))
        ids.append(run.saga_id)
    env.held.clear()
    env.bus.sent.clear()
    gc.collect()
    resident = tracemalloc.get_traced_memory()[0]
    live = env.parts.live
    if len(live) < k:
        raise RuntimeError(f"{len(live)} sagas resident, not {k}")
    for saga_id in ids:
        live.evict(saga_id)
    gc.collect()
    evicted = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {
        "sagas": k,
        "bytes_per_resident_saga": round((resident - evicted) / k),
        "with_history_bytes_per_saga": round((resident - before) / k),
    }


def floor(k: int) -> int:
    """Bytes per bare saga (see the module's docstring): ``k`` of them held waiting, less
    the same once dropped."""
    started(-1)  # what is allocated once, as above
    gc.collect()
    tracemalloc.start()
    held: list[tuple[Any, ...]] = [()] * k  # the list itself allocated before
    for n in range(k):
        held[n] = started(n)
    gc.collect()
    resident = tracemalloc.get_traced_memory()[0]
    for n, (loop, _ctx, task) in enumerate(held):
        if task.done():
            raise RuntimeError(f"bare saga {n} is not waiting")
        loop.discard()
        held[n] = ()
    gc.collect()
    dropped = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return round((resident - dropped) / k)


def run(k: int) -> dict[str, int]:
    return run_loop(measure(k), tune_gc=False) | {"floor_bytes_per_resident_saga": floor(k)}

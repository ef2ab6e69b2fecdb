"""A saga that loops for ever, with and without ``ctx.continue_as_new`` (issue 41 §4).

The saga charges once per iteration (one step: ``command_issued`` and its
``reply_received``). It is driven through the decision core (``SagaRuntime``), its
decisions appended to an ``InMemoryEventStore`` as the engine appends them, and at
checkpoints the saga is loaded as the engine loads it (``EventStore.load_run``) and
rebuilt by replay (``SagaRuntime.replay``), measuring:

- ``events_loaded``: the events a load reads and a replay re-runs;
- ``replay_cpu_ms``: the CPU time to load and rebuild the saga (the median of three);
- ``rebuilt_kib``: the memory the rebuilt saga holds (tracemalloc, after the replay);
- ``live_events``: the events the live copy holds in memory.

``continued``: ``--iterations`` (100,000) with a continue every ``--every`` (100)
iterations; ``one_run``: the same loop without continuing, ``--plain-iterations``
(10,000: its replay grows with its history). Flat memory and replay time per run are
the first's figures staying the same from checkpoint to checkpoint::

    python -m bench.continue_as_new [--iterations 100000] [--every 100]
                                    [--plain-iterations 10000]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from saga_engine import Saga, SagaContext
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import Projection, Reply, StartSaga
from saga_engine.core.history._events import CommandIssued
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.store._memstore import InMemoryEventStore
from saga_engine.store._store import Append, NewSaga

T0 = datetime(2030, 1, 1, tzinfo=UTC)


class Loop(BaseModel):
    i: int = 0
    until: int
    every: int = 0  # 0: never continue


class Charge(BaseModel):
    i: int


class Done(BaseModel):
    iterations: int


class Looping(Saga[Loop, Done]):
    name = "bench-looping"

    async def run(self, ctx: SagaContext, loop: Loop) -> Done:
        i = loop.i
        while i < loop.until:
            await ctx.step(f"charge-{i}", to="payments", command=Charge(i=i))
            i += 1
            if loop.every and i % loop.every == 0 and i < loop.until:
                return await ctx.continue_as_new(loop.model_copy(update={"i": i}))
        return Done(iterations=i)


DEFINITION = SagaDefinition.of(Looping)


async def _rebuild(store: InMemoryEventStore, saga_id: str) -> dict[str, Any]:
    """The saga loaded and replayed as the engine does: its CPU time (the median of
    three, process time: the machine may be shared), then the memory it holds."""
    times = []
    for _ in range(3):
        gc.collect()
        started = time.process_time()
        found = await store.load_run(saga_id)
        runtime, _ = SagaRuntime.replay(DEFINITION, saga_id, [s.event for s in found.events])
        times.append((time.process_time() - started) * 1000)
        loaded = len(found.events)
        runtime.close()
    del found, runtime
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    found = await store.load_run(saga_id)
    runtime, _ = SagaRuntime.replay(DEFINITION, saga_id, [s.event for s in found.events])
    del found
    gc.collect()
    kib = (tracemalloc.get_traced_memory()[0] - base) / 1024
    tracemalloc.stop()
    runtime.close()
    return {
        "events_loaded": loaded,
        "replay_cpu_ms": round(statistics.median(times), 2),
        "rebuilt_kib": round(kib, 1),
    }


async def _drive(iterations: int, every: int, checkpoints: list[int]) -> dict[str, Any]:
    store = InMemoryEventStore()
    saga_id = f"loop-{every}"
    at = T0
    rt, decision = SagaRuntime.start(
        DEFINITION,
        StartSaga(saga_id, Looping.name, Loop(until=iterations, every=every).model_dump(), at),
    )
    await store.create(NewSaga(saga_id, Looping.name, decision.events, decision.projection))
    seq, points = rt.last_seq, []
    started = time.process_time()
    done = 0
    while not rt.status.is_terminal:
        command = next(e for e in reversed(rt.history) if isinstance(e, CommandIssued))
        at += timedelta(seconds=1)
        decision = rt.handle(Reply(command.command_id, "success", at))
        projection: Projection = decision.projection
        await store.append(Append(saga_id, seq, decision.events, projection))
        seq = rt.last_seq
        done += 1
        if done in checkpoints:
            point = {"iteration": done, "run": rt.run, "live_events": len(rt.history)}
            point.update(await _rebuild(store, saga_id))
            points.append(point)
    elapsed = time.process_time() - started
    runs = await store.runs(saga_id)
    rt.close()
    return {
        "iterations": done,
        "continue_every": every or None,
        "runs": len(runs),
        "events_stored": seq,
        "drive_cpu_s": round(elapsed, 2),
        "checkpoints": points,
    }


def _marks(n: int, every: int) -> list[int]:
    """Five checkpoints spread over ``n`` iterations, each at the end of a run when the
    saga continues (its longest point), so that they compare like with like."""
    marks = {max(1, n // 10), n // 4, n // 2, (3 * n) // 4, n - 1}
    if every:
        marks = {max(every, m - m % every) - 1 for m in marks}
    return sorted(marks)


async def main(argv: list[str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--plain-iterations", type=int, default=10_000)
    args = parser.parse_args(argv)
    continued = await _drive(args.iterations, args.every, _marks(args.iterations, args.every))
    plain = await _drive(args.plain_iterations, 0, _marks(args.plain_iterations, 0))
    first, last = continued["checkpoints"][0], continued["checkpoints"][-1]
    return {
        "benchmark": "continue_as_new",
        "python": sys.version.split()[0],
        "continued": continued,
        "one_run": plain,
        "summary": {
            "continued_replay_cpu_ms_first_last": [first["replay_cpu_ms"], last["replay_cpu_ms"]],
            "continued_rebuilt_kib_first_last": [first["rebuilt_kib"], last["rebuilt_kib"]],
            "continued_events_loaded_max": max(
                p["events_loaded"] for p in continued["checkpoints"]
            ),
            "one_run_replay_cpu_ms_last": plain["checkpoints"][-1]["replay_cpu_ms"],
            "one_run_rebuilt_kib_last": plain["checkpoints"][-1]["rebuilt_kib"],
            "one_run_events_loaded_last": plain["checkpoints"][-1]["events_loaded"],
        },
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1:])), indent=2))

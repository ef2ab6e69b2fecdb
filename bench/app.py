"""The application the end-to-end benchmark runs: one 3-step saga and three participants
(and ``Waiter``, a saga that only waits, for bench/scale.py).

Each role runs in its own process, configured by the ``SAGA_*`` environment like any
deployment, plus variables of the benchmark's own:

- ``BENCH_STATE_DIR``: where the process writes ``{role}.ready`` once it owns partitions,
  and ``{role}.stats.{n}.json`` (its counters, and the Kafka requests it has sent by
  API, counted by ``bench.bare.count_kafka_requests``) on the n-th SIGUSR1 and
  ``{role}.stats.final.json`` when it stops;
- ``BENCH_GROUP_COMMIT`` (engine only): ``0`` turns the event store's group commit off;
- ``BENCH_ROLE`` (engine only): the role's name in those files (default ``engine``), so
  that several engines can share one state directory (bench/failover.py);
- ``BENCH_OWNED_POLL_MS`` (engine only): look at the worker's owned inbox partitions this
  often and write ``{role}.owned.{pid}.json`` each time they change: the whole history
  since the process started, as ``[wall time, sorted partitions]`` pairs;
- ``BENCH_PROFILE`` / ``BENCH_PROFILE_CLOCK``: cProfile the measured load
  (between the first and the second SIGUSR1) to that path, timed by ``wall`` or ``cpu``.

The engine's counters files also hold its resident sagas (``live_sagas``, ``live_locks``)
and its memory (``memory_kib``: VmRSS and VmHWM from /proc/self/status;
``allocated_blocks``: the memory blocks Python's allocator has handed out and not freed;
``gc``: the cyclic collector's runs per generation). On SIGUSR2 the engine runs a full
collection (``gc.collect()``) and writes ``{role}.stats.gc.json`` (bench/scale.py asks
whether memory held after eviction is garbage awaiting the collector).
``BENCH_TUNE_GC=0`` runs the engine with CPython's own collector thresholds instead of
``saga_engine.run``'s tuning.

::

    python -m bench.app engine              # SagaWorker, like `saga worker bench.app`
    python -m bench.app participant alpha   # a participant in schema SAGA_PARTICIPANT__DB_SCHEMA

The engine role is ``saga worker`` (saga_engine.cli) with two differences: it opens the
store itself (to choose group commit and to read its batching stats) and it reports
counters on SIGUSR1 (and can profile itself). The worker, the engine and the store are the shipped classes.
With ``SAGA_PG__SHARDS`` (bench/shards.py) the engine's store is the sharded one the
worker would open itself (``connect_event_store``), every shard's group commit counted.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import orjson
from pydantic import BaseModel

from bench.bare import count_kafka_requests, kafka_requests
from saga_engine import Saga, SagaContext, Settings, Signal, run
from saga_engine.participant import CommandBatch, Participant
from saga_engine.store import EventStore, GroupCommitConfig, PostgresEventStore, migrate
from saga_engine.store._connect import connect_event_store
from saga_engine.store._databases import migrate_everywhere
from saga_engine.store._sharded import ShardedEventStore
from saga_engine.worker import SagaWorker

PARTICIPANTS = ("alpha", "beta", "gamma")


def _uvloop() -> bool | None:
    """``BENCH_UVLOOP=0`` runs the process on asyncio's own loop (to measure uvloop)."""
    return False if os.environ.get("BENCH_UVLOOP") == "0" else None


def _tune_gc() -> bool:
    """``BENCH_TUNE_GC=0``: CPython's collector thresholds, not ``saga_engine.run``'s."""
    return os.environ.get("BENCH_TUNE_GC") != "0"


SAGA_NAME = "bench-transfer"


class TransferRequest(BaseModel):
    amount: int


class TransferDone(BaseModel):
    receipts: list[str]


class Apply(BaseModel):
    amount: int


class Revert(BaseModel):
    amount: int


class Applied(BaseModel):
    receipt: str


class Transfer(Saga[TransferRequest, TransferDone]):
    """Three steps, one per participant, each with a compensation and a timeout."""

    name = SAGA_NAME

    async def run(self, ctx: SagaContext, req: TransferRequest) -> TransferDone:
        receipts: list[str] = []
        for participant in PARTICIPANTS:
            reply = await ctx.step(
                f"apply-{participant}",
                to=participant,
                command=Apply(amount=req.amount),
                compensate=Revert(amount=req.amount),
                # Generous: a timeout that fires under load would add retries to the run.
                timeout=120,
                returns=Applied,
            )
            receipts.append(reply.receipt)
        return TransferDone(receipts=receipts)


WAITER_NAME = "bench-waiter"


class WaitRequest(BaseModel):
    #: Sleep until this wall-clock time (seconds since the epoch); None: wait for ``go``.
    until: float | None = None


class Go(BaseModel):
    note: str = ""


class WaitDone(BaseModel):
    woke_by: str


class Waiter(Saga[WaitRequest, WaitDone]):
    """No steps: waits for its ``go`` signal, or sleeps until ``until`` (bench/scale.py)."""

    name = WAITER_NAME
    go = Signal(Go)

    async def run(self, ctx: SagaContext, req: WaitRequest) -> WaitDone:
        if req.until is None:
            await ctx.wait_signal(self.go)
            return WaitDone(woke_by="signal")
        # ctx.now() is the start's time on every replay: the same duration each time.
        await ctx.sleep(max(0.001, req.until - ctx.now().timestamp()))
        return WaitDone(woke_by="timer")


#: The participant's business table. ``at`` is the wall clock when the handler ran
#: (clock_timestamp(), not the transaction's start), which splits a step's round trip
#: into its outbound and return legs.
LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS ledger (
    id bigserial PRIMARY KEY,
    command_id text NOT NULL,
    saga_id text NOT NULL,
    kind text NOT NULL,
    amount int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


#: One statement per batch handler call: every command of the group in one unnest insert.
_INSERT_MANY = """
INSERT INTO ledger (command_id, saga_id, kind, amount)
SELECT c, s, $3, a FROM unnest($1::text[], $2::text[], $4::int[]) AS x(c, s, a)
"""


async def _record(batch: CommandBatch[Apply] | CommandBatch[Revert], kind: str) -> None:
    await batch.execute(
        _INSERT_MANY,
        [c.command_id for c in batch],
        [c.saga_id for c in batch],
        kind,
        [c.command.amount for c in batch],
    )


def build_participant(name: str, settings: Settings) -> Participant:
    participant = Participant(name, settings)

    # Batch handlers: one round trip for all the Apply (or Revert) commands of a consumed
    # batch, instead of one per command.
    @participant.handles_batch(Apply)
    async def apply(batch: CommandBatch[Apply]) -> list[Applied]:
        await _record(batch, "apply")
        return [Applied(receipt=f"{name}:{c.command_id[:8]}") for c in batch]

    @participant.handles_batch(Revert)
    async def revert(batch: CommandBatch[Revert]) -> list[Applied]:
        await _record(batch, "revert")
        return [Applied(receipt=f"{name}:revert") for _ in batch]

    return participant


# --------------------------------------------------------------------------- reporting


def memory_kib(pid: int | str = "self") -> dict[str, int]:
    """A process's resident set now (``VmRSS``) and at its peak (``VmHWM``), in KiB, from
    /proc/<pid>/status (empty if it is gone)."""
    out: dict[str, int] = {}
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0])
    return out


class _Reporter:
    """Writes the ready marker and the counters files the benchmark reads."""

    def __init__(self, role: str, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.dir = Path(os.environ["BENCH_STATE_DIR"])
        self.role = role
        self._snapshot = snapshot
        self.dumps = 0

    def _write(self, name: str, payload: bytes) -> None:
        tmp = self.dir / f".{name}.tmp"
        tmp.write_bytes(payload)
        tmp.rename(self.dir / name)

    def ready(self) -> None:
        self._write(f"{self.role}.ready", str(os.getpid()).encode())

    def dump(self, tag: str | None = None) -> None:
        if tag is None:
            self.dumps += 1
            tag = str(self.dumps)
        times = os.times()
        try:
            snapshot = self._snapshot()
        except Exception as exc:  # the engine's internals change; the counters are extras
            snapshot = {"snapshot_error": repr(exc)}
        payload = {
            **snapshot,
            "kafka_requests": kafka_requests(),
            "cpu_s": times.user + times.system,
        }
        self._write(f"{self.role}.stats.{tag}.json", orjson.dumps(payload))


class _Profiler:
    """cProfile over the measured load only: ``BENCH_PROFILE=path`` turns it on; it starts
    after the first SIGUSR1 (the benchmark's "load begins") and stops at the second.
    ``BENCH_PROFILE_CLOCK=cpu`` times with process CPU time instead of the wall clock."""

    def __init__(self) -> None:
        self.path = os.environ.get("BENCH_PROFILE") or None
        cpu = os.environ.get("BENCH_PROFILE_CLOCK", "wall") == "cpu"
        self.profile: cProfile.Profile | None = None
        if self.path:
            self.profile = cProfile.Profile(time.process_time) if cpu else cProfile.Profile()

    def after_dump(self, n: int) -> None:
        if self.profile is None:
            return
        if n == 1:
            self.profile.enable()
        elif n == 2:
            self.profile.disable()

    def save(self) -> None:
        if self.profile is not None and self.path:
            self.profile.disable()
            self.profile.dump_stats(self.path)


def _signals(stop: asyncio.Event, reporter: _Reporter, profiler: _Profiler | None = None) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def on_usr1() -> None:
        reporter.dump()
        if profiler is not None:
            profiler.after_dump(reporter.dumps)

    loop.add_signal_handler(signal.SIGUSR1, on_usr1)


async def _watch_owned(worker: SagaWorker, reporter: _Reporter, interval_s: float) -> None:
    """Writes ``{role}.owned.{pid}.json`` whenever the worker's owned inbox partitions
    change: every change since the start, with the wall clock (``time.time()``) when it
    was seen, at most ``interval_s`` late. A SIGKILLed process's file stays as it was."""
    pid = os.getpid()
    name = f"{reporter.role}.owned.{pid}.json"
    history: list[tuple[float, list[int]]] = []
    while True:
        owned = sorted(worker.owned_partitions)
        if not history or history[-1][1] != owned:
            history.append((time.time(), owned))
            reporter._write(name, orjson.dumps({"pid": pid, "history": history}))
        await asyncio.sleep(interval_s)


async def _open_store(settings: Settings, config: GroupCommitConfig) -> EventStore:
    """The engine's store, migrated: one Postgres store (group commit as ``config``), or
    with ``SAGA_PG__SHARDS`` the sharded store the worker opens (``connect_event_store``:
    each shard's store with the default group commit) over the migrated control database
    and shards."""
    if not settings.pg.shards:
        await migrate(settings.pg.dsn.get_secret_value(), settings.pg.db_schema)
        return await PostgresEventStore.connect(settings.pg, group_commit=config)
    if config != GroupCommitConfig():
        raise SystemExit("BENCH_GROUP_COMMIT=0 is not supported with SAGA_PG__SHARDS")
    await migrate_everywhere(settings)
    return await connect_event_store(settings)


async def _shard_stores(store: EventStore) -> list[PostgresEventStore]:
    """The Postgres stores whose group commit the counters add up: the one store, or
    every shard's (opened now if the engine has not yet)."""
    if isinstance(store, PostgresEventStore):
        return [store]
    assert isinstance(store, ShardedEventStore)
    shards = [await store.shard(name) for name in store.shard_map.names]
    return [s for s in shards if isinstance(s, PostgresEventStore)]


def _group_commit_stats(stores: list[PostgresEventStore]) -> dict[str, int]:
    """The stores' group commit counters together (the largest batch: of any)."""
    out = {"batches": 0, "operations": 0, "largest_batch": 0}
    for s in stores:
        out["batches"] += s.stats.batches
        out["operations"] += s.stats.operations
        out["largest_batch"] = max(out["largest_batch"], s.stats.largest_batch)
    return out


async def run_engine() -> None:
    settings = Settings()
    enabled = os.environ.get("BENCH_GROUP_COMMIT", "1") != "0"
    config = GroupCommitConfig(enabled=enabled)
    store = await _open_store(settings, config)
    stores = await _shard_stores(store)
    worker = SagaWorker(settings, [Transfer, Waiter], store=store)

    def snapshot() -> dict[str, Any]:
        return {
            "group_commit": {
                "enabled": config.enabled,
                "max_batch": config.max_batch,
                **_group_commit_stats(stores),
            },
            "engine": dict(worker.parts.stats.counts) if worker.engine else {},
            "dead_lettered": worker.stats_dead_lettered,
            "owned_partitions": sorted(worker.owned_partitions),
            "live_sagas": len(worker.parts.live) if worker.engine else None,
            "live_locks": len(worker.parts.live.locks) if worker.engine else None,
            "memory_kib": memory_kib(),
            # Python's allocator: blocks in use now (what eviction can free back to it).
            "allocated_blocks": sys.getallocatedblocks(),
            "gc": {
                "collections": [g["collections"] for g in gc.get_stats()],
                "threshold": gc.get_threshold(),
                **full_collection,
            },
        }

    reporter = _Reporter(os.environ.get("BENCH_ROLE") or "engine", snapshot)
    profiler = _Profiler()
    stop = asyncio.Event()
    _signals(stop, reporter, profiler)
    full_collection: dict[str, float] = {}

    def collect() -> None:
        t0 = time.perf_counter()
        full_collection["collected"] = gc.collect()
        full_collection["collect_s"] = round(time.perf_counter() - t0, 3)
        reporter.dump("gc")

    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, collect)

    async def announce() -> None:
        await worker.assigned_event.wait()
        reporter.ready()

    poll_ms = int(os.environ.get("BENCH_OWNED_POLL_MS") or 0)
    loop = asyncio.get_running_loop()
    watcher = loop.create_task(_watch_owned(worker, reporter, poll_ms / 1000)) if poll_ms else None
    try:
        await worker.start()
        announcer = loop.create_task(announce())
        await stop.wait()
        announcer.cancel()
    finally:
        if watcher is not None:
            watcher.cancel()
        await worker.stop()
        await store.close()
        reporter.dump("final")
        profiler.save()


async def run_participant(name: str) -> None:
    settings = Settings()
    schema = settings.participant.db_schema
    conn = await asyncpg.connect(settings.participant.dsn.get_secret_value())
    try:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(f'SET search_path TO "{schema}"')
        await conn.execute(LEDGER_DDL)
    finally:
        await conn.close()
    participant = build_participant(name, settings)
    reporter = _Reporter(f"participant-{name}", lambda: {"participant": dict(participant.stats)})
    profiler = _Profiler()
    stop = asyncio.Event()
    _signals(stop, reporter, profiler)
    await participant.start()
    try:
        while not stop.is_set():
            if participant.assignment:
                reporter.ready()
                break
            await asyncio.sleep(0.05)
        await stop.wait()
    finally:
        await participant.stop()
        reporter.dump("final")
        profiler.save()


def main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    count_kafka_requests()
    if argv == ["engine"]:
        run(run_engine(), uvloop=_uvloop(), tune_gc=_tune_gc())
        return 0
    if len(argv) == 2 and argv[0] == "participant" and argv[1] in PARTICIPANTS:
        run(run_participant(argv[1]), uvloop=_uvloop())
        return 0
    print(
        f"usage: python -m bench.app engine | participant {{{','.join(PARTICIPANTS)}}}",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

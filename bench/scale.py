"""Scale: the store's queries over a million sagas, and one engine's memory with 100,000 waiting.

    python -m bench.scale [--part queries|memory|both|insights]
    python -m bench.scale --part queries [--finished 1000000] [--open 10000] [--requests 100]
    python -m bench.scale --part memory [--sagas 100000] [--sleepers 5000] [--idle-evict-s 10]

Needs Postgres (both parts) and Kafka (memory), like bench/e2e.py, whose processes,
resources, cleanup and engine pipeline it reuses.

- ``queries``: a fresh migrated schema seeded with ``--finished`` finished sagas (rows of
  ``sagas`` written by SQL) and ``--open`` open ``Waiter`` sagas with real histories
  (written through ``PostgresEventStore.create``); then the admin API's list and metrics,
  called in-process through httpx, each ``--requests`` times; the recovery of each
  partition's open sagas (and of all of them) by a fresh ``Engine``; references measured
  in the same run (a ``SELECT 1`` round trip, ``GET /health``, the scans the store no
  longer does).
- ``memory``: one engine process (``python -m bench.app engine``, default cache size) and
  ``--sagas`` sagas started through the inbox, all waiting: most on a signal, then
  ``--sleepers`` sleeping until one wall time T. Its RSS, resident sagas and evictions
  over time; how late the evicted sleepers' timers fire; signalled evicted sagas finishing.

Progress goes to stderr; stdout gets one JSON object. See bench/README.md for the fields
and the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from pydantic import SecretStr

from bench.app import SAGA_NAME, WAITER_NAME, Transfer, Waiter, memory_kib
from bench.e2e import (
    ROOT,
    BenchError,
    EngineRun,
    Processes,
    Resources,
    RunConfig,
    cleanup,
    dist,
    machine,
    read_json,
    run_bench,
    say,
)
from bench.failover import dist_s, target
from bench.scale_insights import part_insights
from saga_engine import SagaStatus, Settings
from saga_engine.admin import create_admin_app
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import OutboundCommand, StartSaga
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.runner._engine import Engine
from saga_engine.runner._parts import EngineParts
from saga_engine.settings import EngineSettings, PostgresSettings
from saga_engine.store._migrations import migrate
from saga_engine.store._pgstore import PostgresEventStore
from saga_engine.store._store import NewSaga, SagaFilter
from saga_engine.transport._kafka import ensure_topics
from saga_engine.transport._topics import Topics

#: The issue's targets.
QUERY_P99_MS = 50.0
RECOVER_PARTITION_S = 5.0
RSS_MIB = 300.0
BYTES_PER_RESIDENT = 8 * 1024
TIMER_LATENESS_P99_S = 1.0
MIB = 1024 * 1024
#: Memory: sagas started and signalled before the load, so the code paths are loaded.
WARMUP = 200
#: Memory: the columns of the samples in the JSON.
SAMPLE = ["t", "phase", "rss_mib", "live", "evicted", "woken", "blocks_k"]

#: Finished sagas' types and statuses, with their shares (percent).
TYPES = (
    ("order-checkout", 40),
    ("payment-refund", 20),
    ("shipment", 15),
    ("account-onboarding", 10),
    ("subscription-renewal", 10),
    (SAGA_NAME, 5),
)
STATUSES = (("completed", 96.5), ("failed", 1.5), ("compensated", 1.0), ("cancelled", 1.0))


def _pick_sql(choices: Sequence[tuple[str, float]], var: str) -> str:
    """A CASE picking one of ``choices`` by their shares, from ``var`` uniform in [0, 1)."""
    total = sum(w for _, w in choices)
    edge = 0.0
    arms = []
    for name, weight in choices[:-1]:
        edge += weight / total
        arms.append(f"WHEN {var} < {edge:.6f} THEN '{name}'")
    return f"CASE {' '.join(arms)} ELSE '{choices[-1][0]}' END"


# Finished sagas, rows of `sagas` only (listing, metrics and recovery never read a
# finished saga's history). Ids are random UUIDs like the engine's. key_hash: the store
# computes murmur2 in Python; SQL cannot, so a finished saga gets hashtext's value
# instead (no query reads a finished saga's hash: the partial index holds open ones).
SEED_FINISHED = f"""
INSERT INTO sagas (saga_id, saga_type, status, last_seq, idempotency_key, created_at,
                   updated_at, error, key_hash)
SELECT id, saga_type, status, 4 + g % 9, CASE WHEN g % 3 = 0 THEN 'order-' || g END,
       created, created + make_interval(secs => 1 + r3 * 600),
       CASE WHEN status IN ('failed', 'compensated')
            THEN jsonb_build_object('message', 'declined', 'step', 'charge') END,
       hashtext(id) & 2147483647
FROM (
    SELECT g, gen_random_uuid()::text AS id, {_pick_sql(TYPES, "r1")} AS saga_type,
           {_pick_sql(STATUSES, "r2")} AS status, r3,
           $3::timestamptz - r4 * interval '30 days' AS created
    FROM (SELECT g, random() AS r1, random() AS r2, random() AS r3, random() AS r4
          FROM generate_series($1::int, $2::int) AS g) AS r
) AS s
"""


class NoSender:
    """The recovering engine's command sender: counts, sends nothing (Waiter has no step)."""

    def __init__(self) -> None:
        self.sent = 0

    async def send_command(self, command: OutboundCommand) -> None:
        self.sent += 1


# --------------------------------------------------------------------------- queries


async def seed(
    conn: asyncpg.Connection[Any],
    store: PostgresEventStore,
    args: argparse.Namespace,
    now: datetime,
) -> dict[str, Any]:
    """Writes the finished and the open sagas; returns how long it took."""
    rng = random.Random(42)
    await conn.execute("SELECT setseed(0.42)")
    t0 = time.perf_counter()
    chunk = 100_000
    for lo in range(1, args.finished + 1, chunk):
        hi = min(args.finished, lo + chunk - 1)
        await conn.execute(SEED_FINISHED, lo, hi, now)
        say(f"  {hi:,} finished sagas")
    finished_s = time.perf_counter() - t0
    definition = SagaDefinition.of(Waiter)

    async def create(i: int) -> str:
        at = now - timedelta(seconds=rng.random() * 30 * 86400)
        saga_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        key = f"waiter-{i}" if i % 4 == 0 else None
        # A quarter sleep until tomorrow, the rest wait for their signal.
        until = (now + timedelta(days=1)).timestamp() if i % 4 == 1 else None
        start = StartSaga(saga_id, definition.name, {"until": until}, at, key)
        runtime, decision = SagaRuntime.start(definition, start)
        runtime.close()
        new = NewSaga(saga_id, definition.name, decision.events, decision.projection, key)
        if not await store.create(new):
            raise BenchError(f"saga {saga_id} already existed")
        return saga_id

    t0 = time.perf_counter()
    open_ids: list[str] = []
    for lo in range(0, args.open, 1000):
        open_ids += await asyncio.gather(*(create(i) for i in range(lo, min(args.open, lo + 1000))))
    open_s = time.perf_counter() - t0
    # A few parked (compensation_stuck) for days: the oldest-parked query has rows to find.
    await conn.execute(
        "UPDATE sagas SET status = 'compensation_stuck', updated_at = $2::timestamptz "
        "- interval '3 days' WHERE saga_id = ANY($1::text[])",
        open_ids[: args.parked],
        now,
    )
    t0 = time.perf_counter()
    await conn.execute("ANALYZE sagas")
    analyze_s = time.perf_counter() - t0
    size = await conn.fetchval("SELECT pg_total_relation_size('sagas')")
    events = await conn.fetchval("SELECT count(*) FROM saga_events")
    return {
        "finished_s": round(finished_s, 2),
        "open_s": round(open_s, 2),
        "analyze_s": round(analyze_s, 2),
        "open_events": events,
        "finished_rows_per_s": round(args.finished / finished_s),
        "open_sagas_per_s": round(args.open / open_s),
        "sagas_table_with_indexes_mib": round(size / MIB, 1),
    }


async def timed(call: Callable[[], Awaitable[Any]], n: int) -> tuple[dict[str, Any], Any]:
    """``n`` calls one after the other, after one not counted (warm-up): their times in
    ms, and the first call's answer."""
    first = await call()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        await call()
        times.append(time.perf_counter() - t0)
    return dist(times), first


async def measure_api(
    http: httpx.AsyncClient, n: int, now: datetime, key: str, prefix: str
) -> dict[str, dict[str, Any]]:
    def iso(days: float) -> str:
        return (now - timedelta(days=days)).isoformat()

    typ = TYPES[1][0]
    combined = {
        "status": "failed",
        "type": TYPES[0][0],
        "created_after": iso(14),
        "created_before": iso(7),
    }
    lists: dict[str, dict[str, Any]] = {
        "no_filter": {},
        "status_running": {"status": "running"},
        "status_compensated": {"status": "compensated"},
        "type": {"type": typ},
        "created_narrow_1h": {"created_after": iso(15), "created_before": iso(15 - 1 / 24)},
        "created_wide_28d": {"created_after": iso(29), "created_before": iso(1)},
        "updated_after_1d": {"updated_after": iso(1)},
        "q_id_prefix": {"q": prefix},
        "q_idempotency_key": {"q": key},
        "combined": combined,
        "cursor_page_2": {"status": "completed", "type": typ},
    }

    def getter(path: str, params: dict[str, str]) -> Callable[[], Awaitable[Any]]:
        async def call() -> Any:
            response = await http.get(path, params=params)
            if response.status_code != 200:
                raise BenchError(f"GET {path} {params}: {response.status_code} {response.text}")
            return response.json()

        return call

    out: dict[str, dict[str, Any]] = {}
    for name, params in lists.items():
        if name == "cursor_page_2":
            first = await getter("/sagas", params)()
            params = {**params, "cursor": first["next_cursor"]}
        ms, page = await timed(getter("/sagas", params), n)
        out[name] = {
            "params": params,
            "items": len(page["items"]),
            "more": page["next_cursor"] is not None,
            **ms,
        }
        say(f"  /sagas {name}: p50 {ms['p50']} p99 {ms['p99']} ms, {len(page['items'])} items")
    ms, body = await timed(getter("/metrics", {}), n)
    out["metrics"] = {
        "open_total": body["open_total"],
        "oldest_stuck_age_s": body["oldest_stuck_age_seconds"],
        **ms,
    }
    say(f"  /metrics: p50 {ms['p50']} p99 {ms['p99']} ms")
    return out


async def measure_recovery(
    store: PostgresEventStore, settings: Settings, partitions: int
) -> dict[str, Any]:
    """Per partition, a fresh engine recovers that partition's open sagas; then one
    fresh engine recovers them all."""
    per: list[dict[str, Any]] = []

    async def recover(ids: list[str]) -> tuple[float, int]:
        engine = Engine(settings, sagas=[Waiter, Transfer], store=store, sender=NoSender())
        t0 = time.perf_counter()
        n = await engine.recover(ids)
        elapsed = time.perf_counter() - t0
        if n != len(ids):
            raise BenchError(f"recovered {n} of {len(ids)} sagas")
        await engine.close()
        return elapsed, n

    query_s: list[float] = []
    for p in range(partitions):
        t0 = time.perf_counter()
        ids = await store.open_saga_ids({p}, partitions)
        query_s.append(time.perf_counter() - t0)
        elapsed, n = await recover(ids)
        ms = round(1000 * query_s[-1], 2)
        per.append(
            {"partition": p, "sagas": n, "open_saga_ids_ms": ms, "recover_s": round(elapsed, 3)}
        )
        say(f"  partition {p}: {n} sagas, ids in {ms} ms, recovered in {elapsed:.2f}s")
    worst = max(per, key=lambda r: r["recover_s"])
    t0 = time.perf_counter()
    everything = await store.open_saga_ids()
    ms = round(1000 * (time.perf_counter() - t0), 2)
    elapsed, n = await recover(everything)
    say(f"  all partitions: {n} sagas recovered in {elapsed:.2f}s")
    return {
        "partitions": partitions,
        "worst_partition_recover_s": worst["recover_s"],
        "worst_partition_sagas": worst["sagas"],
        "open_saga_ids_ms": dist(query_s),
        "per_partition": per,
        "all_partitions": {"sagas": n, "open_saga_ids_ms": ms, "recover_s": round(elapsed, 3)},
        "recovery_concurrency": settings.engine.recovery_concurrency,
    }


async def measure_references(
    store: PostgresEventStore, http: httpx.AsyncClient, conn: asyncpg.Connection[Any], n: int
) -> dict[str, Any]:
    """The floor (a round trip, the HTTP stack) and what the store used to do."""
    pool = store._pool
    select1, _ = await timed(lambda: pool.fetchval("SELECT 1"), n)
    health, _ = await timed(lambda: http.get("/health"), n)
    sql = "SELECT status, count(*) FROM sagas GROUP BY status"
    scan, rows = await timed(lambda: conn.fetch(sql), 3)

    async def page_through(limit_rows: int, **filters: Any) -> tuple[float, int]:
        t0 = time.perf_counter()
        seen, after = 0, None
        while seen < limit_rows:
            rows = await store.list_sagas(SagaFilter(**filters), limit=1000, after_id=after)
            seen += len(rows)
            if len(rows) < 1000:
                break
            after = rows[-1].saga_id
        return time.perf_counter() - t0, seen

    open_s, open_rows = await page_through(200_000, statuses={s for s in SagaStatus if s.is_open})
    cap_s, cap_rows = await page_through(200_000)
    return {
        "select_1_ms": select1,
        "health_ms": health,
        "count_by_status_full_scan_ms": {**scan, "statuses": len(rows)},
        "old_metrics_open_scan": {"rows": open_rows, "s": round(open_s, 3)},
        "page_through_200k_rows": {"rows": cap_rows, "s": round(cap_s, 3)},
    }


async def part_queries(args: argparse.Namespace, res: Resources) -> dict[str, Any]:
    schema = f"bench_{uuid.uuid4().hex[:8]}_scale"
    res.schemas.append(schema)
    say(f"queries: schema {schema}, {args.finished:,} finished + {args.open:,} open sagas")
    await migrate(res.dsn, schema)
    pg = PostgresSettings(dsn=SecretStr(res.dsn), db_schema=schema)
    settings = Settings(pg=pg)
    store = await PostgresEventStore.connect(pg)
    conn = await asyncpg.connect(res.dsn, timeout=10, server_settings={"search_path": schema})
    now = datetime.now(UTC)
    try:
        seeding = await seed(conn, store, args, now)
        say(f"seeded: {seeding}")
        prefix = (
            await conn.fetchval(
                "SELECT coalesce((SELECT min(saga_id) FROM sagas WHERE saga_id >= $1), min(saga_id)) FROM sagas",
                f"{random.Random(7).getrandbits(32):08x}",
            )
        )[:8]
        key = f"order-{3 * (args.finished // 6)}"
        parts = EngineParts.build(
            settings, sagas=[Waiter, Transfer], store=store, sender=NoSender()
        )
        engine = Engine(parts)
        app = create_admin_app(engine, settings, parts=parts)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as http:
            say(f"admin API: {args.requests} requests per query")
            api = await measure_api(http, args.requests, now, key, prefix)
            say("references")
            refs = await measure_references(store, http, conn, args.requests)
        await engine.close()
        say(f"recovery: {args.partitions} partitions, a fresh engine each")
        recovery = await measure_recovery(store, settings, args.partitions)
    finally:
        await conn.close()
        await store.close()
    worst = max(api, key=lambda k: api[k]["p99"])
    targets = {f"p99_ms.{k}": target(v["p99"], QUERY_P99_MS) for k, v in api.items()}
    targets["recover_partition_s"] = target(
        recovery["worst_partition_recover_s"], RECOVER_PARTITION_S
    )
    return {
        "sagas": {"finished": args.finished, "open": args.open, "parked": args.parked},
        "seeding": seeding,
        "worst_p99": {"query": worst, "ms": api[worst]["p99"]},
        "api_ms": api,
        "recovery": recovery,
        "reference": refs,
        "targets": targets,
        "pass": all(t["pass"] for t in targets.values()),
        "schema": schema,
    }


# --------------------------------------------------------------------------- memory


class MemoryRun(EngineRun):
    """bench/e2e.py's engine pipeline reduced to its engine: Waiter sagas need no
    participant. Started through ``SagaClient`` (EngineRun's starter)."""

    def __init__(
        self, args: argparse.Namespace, res: Resources, procs: Processes, logs: Path, tag: str
    ) -> None:
        cfg = RunConfig(
            concurrency=0,
            load_s=0.0,
            warmup=0,
            probe=0,
            partitions=args.partitions,
            fetch_max_wait_ms=20,
            group_commit=True,
            uvloop=True,
            drain_timeout_s=0.0,
            start_timeout_s=60.0,
            poll_s=1.0,
            profile=None,
            profile_clock="wall",
            profile_role="engine",
            idle_s=0.0,
        )
        super().__init__(cfg, res, procs, logs, tag)
        self.args = args
        self.roles = ["engine"]
        self.samples: list[dict[str, Any]] = []
        self.t0 = time.time()
        self.phase = "start"
        #: What the run saw, by name (samples, times, lists), for the report.
        self.marks: dict[str, Any] = {}
        self.conn: asyncpg.Connection[Any]
        #: One counters request at a time: two SIGUSR1 close together may arrive as one.
        self._sampling = asyncio.Lock()

    def topic_names(self) -> list[str]:
        topics = Topics.of(self.settings.kafka)
        return [topics.inbox, topics.dlq]

    def _spawn_all(self) -> None:
        env = self._env(
            SAGA_ENGINE__IDLE_EVICT_S=str(self.args.idle_evict_s),
            BENCH_TUNE_GC="1" if self.args.engine_gc == "tuned" else "0",
        )
        self.procs.spawn("engine", ["-m", "bench.app", "engine"], env, self.dir / "engine.log")

    @property
    def pid(self) -> int:
        return self.procs.procs["engine"].popen.pid

    async def sample(self) -> dict[str, Any]:
        """The engine's RSS (read here, from /proc) and its resident sagas and eviction
        counters (its counters file, asked for by SIGUSR1)."""
        async with self._sampling:
            stats = (await self._stats())["engine"]
        mem = memory_kib(self.pid)
        counts = stats.get("engine") or {}
        row = {
            "t": round(time.time() - self.t0, 1),
            "phase": self.phase,
            "rss_mib": round(mem.get("VmRSS", 0) / 1024, 1),
            "hwm_mib": round(mem.get("VmHWM", 0) / 1024, 1),
            "live": stats.get("live_sagas"),
            "locks": stats.get("live_locks"),
            "evicted": counts.get("sagas_evicted", 0),
            "woken": counts.get("sagas_woken", 0),
            "blocks_k": round((stats.get("allocated_blocks") or 0) / 1000),
        }
        self.samples.append(row)
        return row

    async def collect(self, tag: str) -> dict[str, Any]:
        """Has the engine run a full garbage collection (SIGUSR2), then samples it."""
        path = self.dir / "engine.stats.gc.json"
        path.unlink(missing_ok=True)
        self.procs.send("engine", signal.SIGUSR2)
        await self._wait_files([path.name], 60, "the engine's full collection")
        gc_run = (read_json(path) or {}).get("gc") or {}
        return {"at": tag, **gc_run, **(await self.sample())}

    async def sampler(self) -> None:
        while True:
            await asyncio.sleep(self.args.sample_s)
            await self.sample()

    async def until(
        self, what: str, check: Callable[[], Awaitable[bool]], timeout_s: float, every: float = 0.2
    ) -> float:
        """Polls ``check`` until true (at most ``timeout_s``); returns the wall clock then."""
        deadline = last = time.monotonic()
        deadline += timeout_s
        while not await check():
            self.procs.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(f"timed out after {timeout_s:.0f}s waiting for {what}")
            if time.monotonic() - last > 10:
                last = time.monotonic()
                say(f"  waiting for {what}; {self.samples[-1] if self.samples else ''}")
            await asyncio.sleep(every)
        return time.time()

    async def recorded(self, ids: list[str], status: str = "", timeout_s: float = 0) -> float:
        """Waits until every saga of ``ids`` is recorded (in ``status``, if given)."""
        sql = "SELECT count(*) FROM sagas WHERE saga_id = ANY($1::text[])"
        sql += f" AND status = '{status}'" if status else ""

        async def check() -> bool:
            return int(await self.conn.fetchval(sql, ids)) >= len(ids)

        what = f"{len(ids)} sagas {status or 'recorded'}"
        return await self.until(what, check, timeout_s or self.args.wait_s)

    async def send(self, ids: list[str], until: float | None = None, go: bool = False) -> float:
        """Starts the sagas (sleeping until ``until``, else waiting) or signals them,
        through SagaClient, ``--start-chunk`` at once; returns the wall clock of the first."""
        client = self.client
        assert client is not None
        body = {} if until is None else {"until": until}
        first = time.time()
        for lo in range(0, len(ids), self.args.start_chunk):
            await asyncio.gather(
                *(
                    client.signal(i, "go", {}) if go else client.start(WAITER_NAME, body, saga_id=i)
                    for i in ids[lo : lo + self.args.start_chunk]
                )
            )
            self.procs.check_alive()
        return first

    async def events(self, ids: list[str], kind: str, since: float) -> list[float]:
        """When the sagas' events of one kind were recorded, in seconds after ``since``."""
        rows = await self.conn.fetch(
            "SELECT extract(epoch FROM recorded_at)::float8 AS rec FROM saga_events "
            "WHERE saga_id = ANY($1::text[]) AND kind = $2",
            ids,
            kind,
        )
        return [r["rec"] - since for r in rows]

    async def run(self) -> dict[str, Any]:
        a, m = self.args, self.marks
        self.res.schemas.append(self.schema)
        names = self.topic_names()
        self.res.topics += names
        await ensure_topics(self.settings.kafka, names)
        self._spawn_all()
        await self._wait_files(["engine.ready"], 60, "the engine to be ready")
        dsn, path = self.res.dsn, {"search_path": self.schema}
        self.conn = await asyncpg.connect(dsn, timeout=10, server_settings=path)
        sampler: asyncio.Task[None] | None = None
        try:
            await self.open_starter()
            m["idle"] = await self.sample()
            warm = [str(uuid.uuid4()) for _ in range(WARMUP)]  # started, then signalled
            await self.send(warm)
            await self.recorded(warm, "running", 60)
            await self.send(warm, go=True)
            await self.recorded(warm, "completed", 60)
            await asyncio.sleep(2)
            m["before"] = await self.sample()
            sampler = asyncio.get_running_loop().create_task(self.sampler())
            waiting = [str(uuid.uuid4()) for _ in range(a.sagas - a.sleepers)]
            say(f"load: {len(waiting):,} sagas waiting for a signal")
            self.phase = "load"
            m["t_first"] = await self.send(waiting)
            m["sent_s"] = time.time() - m["t_first"]
            m["t_recorded"] = await self.recorded(waiting)
            m["load_end"] = await self.sample()
            m["gc_load_end"] = await self.collect("load_end")
            rate = m["rate"] = len(waiting) / max(0.001, m["t_recorded"] - m["t_first"])
            say(f"  recorded in {len(waiting) / rate:.1f}s ({rate:.0f}/s); {m['load_end']}")
            # The sleepers, after the rest: T leaves them time to be recorded and then
            # evicted (idle for idle_evict_s) before it comes.
            self.phase = "sleepers"
            est = 1.5 * a.sleepers / rate + 2
            t_wake = m["T"] = time.time() + est + a.idle_evict_s + a.timer_margin_s
            sleepers = [str(uuid.uuid4()) for _ in range(a.sleepers)]
            say(f"{a.sleepers:,} sagas sleeping until T (in {t_wake - time.time():.1f}s)")
            await self.send(sleepers, until=t_wake)
            m["t_sleepers"] = await self.recorded(sleepers)
            self.phase = "timers"
            await asyncio.sleep(max(0.0, t_wake - time.time() - 0.5))
            m["at_T"] = await self.sample()
            await self.recorded(sleepers, "completed")
            m["fired"] = await self.events(sleepers, "timer_fired", t_wake)
            m["ended"] = await self.events(sleepers, "saga_completed", t_wake)
            say(f"  timers: lateness {dist_s(m['fired'])}")
            self.phase = "signals"
            chosen = waiting[: a.signals]  # the first started: evicted long ago
            t_sig = await self.send(chosen, go=True)
            await self.recorded(chosen, "completed")
            m["signalled"] = await self.events(chosen, "saga_completed", t_sig)
            say(f"  signals: {len(m['signalled'])} completed, last {max(m['signalled']):.2f}s")
            self.phase = "settle"

            async def settled() -> bool:
                live: int = (await self.sample())["live"] or 0
                return bool(live <= a.settle_live)

            await self.until("eviction to settle", settled, a.idle_evict_s + 60, every=1.0)
            m["after"] = await self.sample()
            m["gc_after"] = await self.collect("after_eviction")
        finally:
            if sampler is not None:
                sampler.cancel()
            await self.close_starter()
            await self.conn.close()
        self.procs.stop_all()
        return self.report(read_json(self.dir / "engine.stats.final.json") or {})

    def report(self, final: dict[str, Any]) -> dict[str, Any]:
        a, m = self.args, self.marks
        cache = EngineSettings().cache_size
        # The first moment the cache is full: the least garbage of evicted sagas in RSS.
        load = [s for s in self.samples if s["phase"] == "load" and s["live"]]
        full = next((s for s in load if s["live"] >= cache), m["load_end"])
        base = m["before"]["rss_mib"]

        def per_saga(row: dict[str, Any]) -> float | None:
            live = row["live"] or 0
            return round((row["rss_mib"] - base) * MIB / live) if live else None

        peak = max(s["hwm_mib"] for s in self.samples)
        fired, signalled = dist_s(m["fired"]), m["signalled"]
        targets = {
            "rss_peak_mib": target(peak, RSS_MIB),
            "bytes_per_resident_saga": target(per_saga(full), BYTES_PER_RESIDENT),
            "timer_lateness_p99_s": target(fired.get("p99"), TIMER_LATENESS_P99_S),
            "signalled_evicted_not_completed": target(a.signals - len(signalled), 0),
        }
        counts = final.get("engine") or {}
        start = {
            "per_s": round(m["rate"], 1),
            "sent_s": round(m["sent_s"], 2),
            "recorded_s": round(m["t_recorded"] - m["t_first"], 2),
        }
        # The engine's defaults (this checkout's EngineSettings), but for what the run set.
        engine_settings = {
            **EngineSettings().model_dump(),
            "idle_evict_s": a.idle_evict_s,
            "collector": a.engine_gc,
        }
        at = {
            "idle_after_start": m["idle"],
            "before_load": m["before"],
            "cache_full": full,
            "load_end": m["load_end"],
            "at_T": m["at_T"],
            "after_eviction": m["after"],
        }
        return {
            "sagas": {"signal": a.sagas - a.sleepers, "sleep": a.sleepers, "warmup": WARMUP},
            "rss_mib": {**{k: v["rss_mib"] for k, v in at.items()}, "peak": peak},
            "live_sagas": {**{k: v["live"] for k, v in at.items()}, "cache_size": cache},
            "allocated_blocks_k": {k: v["blocks_k"] for k, v in at.items()},
            "bytes_per_resident_saga": per_saga(full),
            "bytes_per_resident_saga_at_load_end": per_saga(m["load_end"]),
            "sagas_evicted": counts.get("sagas_evicted"),
            "sagas_woken": counts.get("sagas_woken"),
            "start": start,
            "timers": {
                "sleepers_recorded_before_T_s": round(m["T"] - m["t_sleepers"], 2),
                # Sleepers the poller had loaded from the store 0.5 s before T.
                "woken_before_T": m["at_T"]["woken"],
                "timer_fired_s": {**fired, "min": round(min(m["fired"], default=0), 3)},
                "completed_s": dist_s(m["ended"]),
            },
            "signalled_evicted": {
                "signalled": a.signals,
                "completed": len(signalled),
                "first_signal_to_last_completion_s": round(max(signalled, default=0), 3),
                "completion_s": dist_s(signalled),
            },
            "targets": targets,
            "pass": all(t["pass"] for t in targets.values()),
            "engine_settings": engine_settings,
            "engine_counters": counts,
            # A full collection (gc.collect()) at load end and after eviction: what the
            # cyclic collector finds, and what RSS and the blocks are after it.
            "full_collections": [m["gc_load_end"], m["gc_after"]],
            "gc_collections_by_generation": (final.get("gc") or {}).get("collections"),
            "samples": {"columns": SAMPLE, "rows": [[s[k] for k in SAMPLE] for s in self.samples]},
        }


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    parts = ["queries", "memory", "both", "insights"]
    ap.add_argument(
        "--part", choices=parts, default="both", help="insights: bench/scale_insights.py"
    )
    ap.add_argument("--finished", type=int, default=1_000_000, help="queries: finished sagas")
    ap.add_argument("--open", type=int, default=10_000, help="queries: open sagas (histories)")
    ap.add_argument("--parked", type=int, default=20, help="queries: open sagas made parked")
    ap.add_argument("--requests", type=int, default=100, help="queries: requests per query")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--sagas", type=int, default=100_000, help="memory: sagas started")
    ap.add_argument("--sleepers", type=int, default=5_000, help="memory: of them, sleeping to T")
    ap.add_argument("--signals", type=int, default=1_000, help="memory: evicted sagas signalled")
    ap.add_argument("--idle-evict-s", type=float, default=10.0, help="memory: engine setting")
    gc_help = "memory: saga_engine.run's collector tuning, or CPython's thresholds"
    ap.add_argument("--engine-gc", choices=["tuned", "default"], default="tuned", help=gc_help)
    ap.add_argument("--timer-margin-s", type=float, default=5.0, help="memory: T's extra margin")
    ap.add_argument("--start-chunk", type=int, default=1000, help="memory: starts sent at once")
    ap.add_argument("--sample-s", type=float, default=1.0, help="memory: RSS sampling period")
    ap.add_argument("--settle-live", type=int, default=0, help="memory: resident sagas settled")
    ap.add_argument("--wait-s", type=float, default=240.0, help="memory: limit for each wait")
    ap.add_argument("--max-seconds", type=float, default=900.0, help="limit for the whole run")
    ap.add_argument("--keep", action="store_true", help="keep the schemas, topics and logs")
    ap.add_argument("--json-out", type=Path, help="also write the JSON result to this file")
    args = ap.parse_args(argv)
    if args.sleepers >= args.sagas or args.signals > args.sagas - args.sleepers:
        ap.error("--sleepers and --signals must leave sagas waiting for a signal")
    if min(args.finished, args.open, args.requests) < 1 or args.parked > args.open:
        ap.error("--finished, --open and --requests must be positive, --parked <= --open")
    return args


async def bench(args: argparse.Namespace, res: Resources, procs: Processes, logs: Path) -> Any:
    out: dict[str, Any] = {
        "benchmark": "scale",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
    }
    if args.part in ("queries", "both"):
        out["queries"] = await part_queries(args, res)
        if not args.keep:
            await cleanup(res)
    if args.part in ("memory", "both"):
        out["memory"] = await MemoryRun(args, res, procs, logs, uuid.uuid4().hex[:8]).run()
    if args.part == "insights":
        out["insights"] = await part_insights(args, res)
    parts = [out[p] for p in ("queries", "memory", "insights") if p in out]
    out["pass"] = all(p["pass"] for p in parts)
    out["settings"] = {k: v for k, v in vars(args).items() if k not in ("json_out", "keep")}
    return out


def git_state() -> dict[str, Any]:
    """The commit measured, and whether saga_engine/ had changes not in it."""

    def git(*cmd: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *cmd], capture_output=True, text=True)
        return done.stdout.strip()

    return {
        "commit": git("rev-parse", "HEAD"),
        "engine_tree_dirty": bool(git("status", "--porcelain", "saga_engine")),
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    return run_bench(args, bench, log_prefix="saga-scale-", extra={"git": git_state()})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

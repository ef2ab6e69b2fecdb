"""Durable schedules: fire lateness of 10,000 one-minute schedules on the real stack.

    python -m bench.schedules                       # ~5 min: spread, then aligned
    python -m bench.schedules --seconds 70 --modes spread

Needs ``SAGA_PG__DSN`` and ``SAGA_KAFKA__BOOTSTRAP_SERVERS`` (``scripts/devstack.py env``).
Prints one JSON object on stdout; progress on stderr.

What one run does, per mode (``spread``: the schedules' phases spread over the minute,
``aligned``: all on the same second):

1. a fresh schema (migrated) and a fresh inbox topic (``--partitions``);
2. ``--schedules`` (10,000) schedules of ``every_s=60``, inserted in bulk;
3. ``--engines`` (2) scheduler loops, each on its own pool (two engines' worth of
   connections) and its own Kafka producer, run for ``--seconds`` (130: two minutes of
   ticks and more). Each fired tick's **lateness** is the time its claim committed (its
   start request acknowledged by Kafka before that) minus the tick's time;
4. the **ceiling**: every schedule made due at once, then the same SQL with no
   scheduler (claim ``--batch`` rows ``FOR UPDATE SKIP LOCKED``, send one pre-encoded
   record per row and await the acknowledgements, move the rows on with one ``UPDATE``,
   commit) drains them on the same pools and producers; beside it, the scheduler's own
   drain of the same burst (``Scheduler.run_due``, plans and envelopes included).

The inbox is not consumed: no engine runs here, so what is measured is the scheduler's
part of a start (claim, plan, send, acknowledge, commit), not the saga's own start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient

from saga_engine._kafka import delivered, ensure_topics, make_producer, start_record
from saga_engine._migrations import migrate
from saga_engine._pgschedules import PostgresScheduleStore
from saga_engine._schedule import CatchUp, Overlap, Schedule
from saga_engine._schedule_store import FireResult, Firing
from saga_engine._scheduler import KafkaStarts, Scheduler
from saga_engine._wire import encode
from saga_engine.settings import KafkaSettings, PostgresSettings, ScheduleSettings

SAGA_TYPE = "nightly-report"


def log(message: str) -> None:
    print(f"[bench.schedules] {message}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "count": len(values),
        "p50_s": round(pct(values, 0.50), 4),
        "p99_s": round(pct(values, 0.99), 4),
        "max_s": round(max(values), 4) if values else None,
        "mean_s": round(statistics.fmean(values), 4) if values else None,
    }


async def insert_schedules(
    conn: asyncpg.Connection[Any], n: int, aligned: bool, now: datetime
) -> None:
    rows = []
    for i in range(n):
        offset = 0.0 if aligned else round(i * 60.0 / n, 3)
        s = Schedule(id=f"s{i:05d}", saga=SAGA_TYPE, every_s=60, offset_s=offset,
                     input={"n": i}, overlap=Overlap.ALLOW, catchup=CatchUp.LAST)  # fmt: skip
        spec = s.spec
        rows.append((
            s.id, s.saga, json.dumps(spec.model_dump(mode="json")), json.dumps(s.input),
            s.catchup.value, s.catchup_max, s.overlap.value,
            json.dumps(s.definition()), spec.next_after(now), now,
        ))  # fmt: skip
    await conn.executemany(
        """
        INSERT INTO saga_schedules (schedule_id, saga_type, spec, input, catchup, catchup_max,
            overlap, state, origin, definition, next_fire_at, created_at, updated_at)
        VALUES ($1, $2, $3::jsonb, $4::jsonb, $5, $6, $7, 'active', 'api', $8::jsonb, $9, $10, $10)
        """,
        rows,
    )


async def ceiling(
    pools: list[asyncpg.Pool[Any]], producers: list[Any], topic: str, batch: int
) -> float:
    """Rows/s of the claim's SQL and Kafka pattern with no scheduler around it: the
    same statements, and one real start request's bytes and headers, encoded once."""
    sample = Firing("s", SAGA_TYPE, str(uuid.uuid4()), "schedule:s:t", {"n": 1}, datetime.now(UTC))
    key, record, headers = encode(KafkaStarts(None, topic, "/bench")._envelope(sample))

    async def drain(pool: asyncpg.Pool[Any], producer: Any) -> int:
        done = 0
        while True:
            async with pool.acquire() as conn, conn.transaction():
                ids = [
                    r["schedule_id"]
                    for r in await conn.fetch(
                        "SELECT schedule_id FROM saga_schedules WHERE state = 'active' AND "
                        "next_fire_at <= now() ORDER BY next_fire_at LIMIT $1 "
                        "FOR UPDATE SKIP LOCKED",
                        batch,
                    )
                ]
                if not ids:
                    return done
                deliveries = [
                    await start_record(producer, topic, key, record, headers) for _ in ids
                ]
                errors = [e for e in await delivered(deliveries) if e is not None]
                if errors:
                    raise errors[0]
                await conn.execute(
                    "UPDATE saga_schedules SET next_fire_at = next_fire_at + interval '1 day', "
                    "fired_count = fired_count + 1, updated_at = now() "
                    "WHERE schedule_id = ANY($1::text[])",
                    ids,
                )
                done += len(ids)

    start = time.perf_counter()
    counts = await asyncio.gather(*(drain(p, k) for p, k in zip(pools, producers, strict=True)))
    return sum(counts) / (time.perf_counter() - start)


async def make_due(pool: asyncpg.Pool[Any]) -> int:
    """Every schedule due at once: its next_fire_at set to its latest tick before now."""
    n: int = await pool.fetchval(
        """
        WITH u AS (
            UPDATE saga_schedules SET next_fire_at = to_timestamp(
                floor((extract(epoch FROM now()) - (spec->>'offset_s')::float8) / 60) * 60
                + (spec->>'offset_s')::float8)
            RETURNING 1)
        SELECT count(*) FROM u
        """
    )
    return n


async def run_mode(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    dsn = os.environ["SAGA_PG__DSN"]
    bootstrap = os.environ.get("SAGA_KAFKA__BOOTSTRAP_SERVERS", "localhost:9092")
    run_id = uuid.uuid4().hex[:8]
    schema = f"bench_sched_{run_id}"
    kafka = KafkaSettings(bootstrap_servers=bootstrap, partitions=args.partitions)
    topic = f"bench-sched-{run_id}.inbox"
    pg = PostgresSettings(dsn=dsn, db_schema=schema)
    await migrate(dsn, schema)
    await ensure_topics(kafka, [topic])
    stores = [await PostgresScheduleStore.connect(pg) for _ in range(args.engines)]
    producers = [make_producer(kafka) for _ in range(args.engines)]
    for p in producers:
        await p.start()
    lateness: list[float] = []
    fired_ids: Counter[str] = Counter()
    claims: list[int] = []

    def on_fired(result: FireResult, durable_at: datetime) -> None:
        claims.append(result.claimed)
        for f in result.fired:
            lateness.append((durable_at - f.tick).total_seconds())
            fired_ids[f.saga_id] += 1

    try:
        conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
        try:
            now = datetime.now(UTC)
            t = time.perf_counter()
            await insert_schedules(conn, args.schedules, mode == "aligned", now)
            log(f"{mode}: {args.schedules} schedules inserted in {time.perf_counter() - t:.1f}s")
        finally:
            await conn.close()
        config = ScheduleSettings(batch_size=args.batch, poll_s=args.poll)
        schedulers = [
            Scheduler(s, KafkaStarts(p, topic, "/bench/schedules"), config, on_fired=on_fired)
            for s, p in zip(stores, producers, strict=True)
        ]
        started = datetime.now(UTC)
        cpu0 = time.process_time()
        for s in schedulers:
            s.start()
        await asyncio.sleep(args.seconds)
        for s in schedulers:
            await s.stop()
        cpu = time.process_time() - cpu0
        ended = datetime.now(UTC)
        # Every tick in (started, ended - 5 s] must have fired: count the expected ones.
        expected = 0
        horizon = ended - timedelta(seconds=5)
        for i in range(args.schedules):
            offset = 0.0 if mode == "aligned" else round(i * 60.0 / args.schedules, 3)
            spec = Schedule(id="x", saga=SAGA_TYPE, every_s=60, offset_s=offset).spec
            tick = spec.next_after(started)
            while tick <= horizon:
                expected += 1
                tick += timedelta(seconds=60)
        late_fired = list(lateness)
        log(f"{mode}: fired {len(lateness)} ticks (expected >= {expected}), measuring the ceiling")
        # The ceiling and the scheduler's drain of one burst of every schedule.
        pools = [s._pool for s in stores]
        await make_due(pools[0])
        raw = await ceiling(pools, producers, topic, args.batch)
        await make_due(pools[0])
        drainers = [
            Scheduler(s, KafkaStarts(p, topic, "/bench"), config)
            for s, p in zip(stores, producers, strict=True)
        ]
        t = time.perf_counter()
        drained = sum(await asyncio.gather(*(d.run_due() for d in drainers)))
        drain_rate = drained / (time.perf_counter() - t)
        return {
            "mode": mode,
            "schedules": args.schedules,
            "engines": args.engines,
            "seconds": args.seconds,
            "ticks_fired": len(late_fired),
            "ticks_expected_at_least": expected,
            "duplicates": sum(1 for c in fired_ids.values() if c > 1),
            "lateness": summary(late_fired),
            "claims": len(claims),
            "mean_rows_per_claim": round(statistics.fmean(claims), 1) if claims else 0,
            "cpu_s_per_1000_ticks": round(1000 * cpu / max(1, len(late_fired)), 3),
            "ceiling_rows_per_s": round(raw),
            "scheduler_drain_rows_per_s": round(drain_rate),
            "drain_vs_ceiling": round(drain_rate / raw, 2) if raw else None,
        }
    finally:
        for store in stores:
            await store.close()
        for p in producers:
            await p.stop()
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()


async def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.schedules", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--schedules", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=130.0)
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument(
        "--modes", nargs="+", choices=["spread", "aligned"], default=["spread", "aligned"]
    )
    ap.add_argument("--max-seconds", type=float, default=900.0)
    args = ap.parse_args(argv)
    if "SAGA_PG__DSN" not in os.environ:
        print("SAGA_PG__DSN is not set: run under `scripts/devstack.py env`", file=sys.stderr)
        return 2
    results = []
    async with asyncio.timeout(args.max_seconds):
        for mode in args.modes:
            results.append(await run_mode(args, mode))
            log(json.dumps(results[-1]))
    print(json.dumps({"bench": "schedules", "target_p99_s": 2.0, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))

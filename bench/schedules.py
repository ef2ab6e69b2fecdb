"""Durable schedules: fire lateness of 10,000 one-minute schedules on the real stack.

    python -m bench.schedules                       # ~5 min: spread, then aligned
    python -m bench.schedules --seconds 70 --modes spread

Needs ``SAGA_PG__DSN`` and ``SAGA_KAFKA__BOOTSTRAP_SERVERS`` (``scripts/devstack.py env``).
Prints one JSON object on stdout; progress on stderr.

What one run does, per mode (``spread``: the schedules' phases spread over the minute,
``aligned``: all on the same second):

1. a fresh schema (migrated) and a fresh inbox topic (``--partitions``);
2. ``--schedules`` (10,000) schedules of ``every_s=60``, inserted in bulk;
3. ``--engines`` (2) engine processes, each running the worker's scheduler loop
   (``Scheduler`` with the default ``ScheduleSettings``: its own pool and Kafka
   producer), for ``--seconds`` (130: two minutes of ticks and more). Each fired tick's
   **lateness** is the time its claim committed (its start request acknowledged by Kafka
   before that) minus the tick's time; each process writes its samples to a file;
4. the **ceiling**, in the same processes: every schedule made due at once, then the
   same SQL with no scheduler (claim ``--batch`` rows ``FOR UPDATE SKIP LOCKED``, send
   one pre-encoded real start request per row and await the acknowledgements, move the
   rows on with one ``UPDATE``, commit; one claim at a time per process) drains them;
   beside it, the scheduler's own drain of the same burst (``Scheduler.run_due``,
   plans, envelopes and concurrent claims included).

The inbox is not consumed: no engine runs here, so what is measured is the scheduler's
part of a start (claim, plan, send, acknowledge, commit), not the saga's own start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka.admin import AIOKafkaAdminClient

from saga_engine.core.planning._schedule import CatchUp, Overlap, Schedule
from saga_engine.runner._scheduler import Scheduler
from saga_engine.settings import KafkaSettings, PostgresSettings, ScheduleSettings
from saga_engine.store._migrations import migrate
from saga_engine.store._pgschedules import PostgresScheduleStore
from saga_engine.store._schedule_store import FireResult, Firing
from saga_engine.transport._kafka import await_acks, ensure_topics, make_producer, start_record
from saga_engine.transport._wire import encode
from saga_engine.worker._schedules import KafkaStarts

SAGA_TYPE = "nightly-report"
ROOT = Path(__file__).resolve().parent.parent


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


def offset_of(i: int, n: int, aligned: bool) -> float:
    return 0.0 if aligned else round(i * 60.0 / n, 3)


async def insert_schedules(
    conn: asyncpg.Connection[Any], n: int, aligned: bool, now: datetime
) -> None:
    rows = []
    for i in range(n):
        s = Schedule(
            id=f"s{i:05d}",
            saga=SAGA_TYPE,
            every_s=60,
            offset_s=offset_of(i, n, aligned),
            input={"n": i},
            overlap=Overlap.ALLOW,
            catchup=CatchUp.LAST,
        )
        spec = s.spec
        rows.append(
            (
                s.id,
                s.saga,
                json.dumps(spec.model_dump(mode="json")),
                json.dumps(s.input),
                s.catchup.value,
                s.catchup_max,
                s.overlap.value,
                json.dumps(s.definition()),
                spec.next_after(now),
                now,
            )
        )
    await conn.executemany(
        """
        INSERT INTO saga_schedules (schedule_id, saga_type, spec, input, catchup, catchup_max,
            overlap, state, origin, definition, next_fire_at, created_at, updated_at)
        VALUES ($1, $2, $3::jsonb, $4::jsonb, $5, $6, $7, 'active', 'api', $8::jsonb, $9, $10, $10)
        """,
        rows,
    )


async def make_due(dsn: str, schema: str) -> int:
    """Every schedule due at once: its next_fire_at set to its latest tick before now."""
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        n: int = await conn.fetchval(
            """
            WITH u AS (
                UPDATE saga_schedules SET next_fire_at = to_timestamp(
                    floor((extract(epoch FROM now()) - (spec->>'offset_s')::float8) / 60) * 60
                    + (spec->>'offset_s')::float8)
                RETURNING 1)
            SELECT count(*) FROM u
            """
        )
    finally:
        await conn.close()
    return n


async def raw_drain(pool: asyncpg.Pool[Any], producer: Any, topic: str, batch: int) -> int:
    """The claim's SQL and Kafka pattern with no scheduler around it: the same
    statements, and one real start request's bytes and headers, encoded once."""
    sample = Firing("s", SAGA_TYPE, str(uuid.uuid4()), "schedule:s:t", {"n": 1}, datetime.now(UTC))
    key, record, headers = encode(KafkaStarts(None, topic, "/bench")._envelope(sample))
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
            deliveries = [await start_record(producer, topic, key, record, headers) for _ in ids]
            errors = [e for e in await await_acks(deliveries) if e is not None]
            if errors:
                raise errors[0]
            await conn.execute(
                "UPDATE saga_schedules SET next_fire_at = next_fire_at + interval '1 day', "
                "fired_count = fired_count + 1, updated_at = now() "
                "WHERE schedule_id = ANY($1::text[])",
                ids,
            )
            done += len(ids)


def _exists(path: Path) -> bool:
    return path.exists()


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "bench.schedules", *args], cwd=ROOT)


async def wait_file(path: Path, within_s: float = 120.0) -> None:
    deadline = time.monotonic() + within_s
    while not _exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        await asyncio.sleep(0.02)


async def engine(args: argparse.Namespace) -> int:
    """One engine process: the scheduler for ``--seconds``, then the two drains."""
    work = Path(args.work)
    kafka = KafkaSettings(
        bootstrap_servers=os.environ.get("SAGA_KAFKA__BOOTSTRAP_SERVERS", "localhost:9092")
    )
    pg = PostgresSettings(dsn=os.environ["SAGA_PG__DSN"], db_schema=args.schema)
    config = ScheduleSettings()
    store = await PostgresScheduleStore.connect(pg, claims_in_flight=config.claims_in_flight)
    producer = make_producer(kafka)
    await producer.start()
    lateness: list[float] = []
    ids: list[str] = []
    claims: list[int] = []

    def on_fired(result: FireResult, durable_at: datetime) -> None:
        claims.append(result.claimed)
        for f in result.fired:
            lateness.append((durable_at - f.tick).total_seconds())
            ids.append(f.saga_id)

    try:
        scheduler = Scheduler(
            store, KafkaStarts(producer, args.topic, "/bench"), config, on_fired=on_fired
        )
        cpu0 = time.process_time()
        scheduler.start()
        await asyncio.sleep(args.seconds)
        await scheduler.stop()
        cpu = time.process_time() - cpu0
        (work / f"{args.name}.ticks.json").write_text(
            json.dumps({"lateness": lateness, "ids": ids, "claims": claims, "cpu_s": cpu})
        )
        result: dict[str, Any] = {}
        for phase in ("ceiling", "drain"):
            await wait_file(work / f"go-{phase}")
            start = time.time()
            if phase == "ceiling":
                n = await raw_drain(store._pool, producer, args.topic, config.batch_size)
            else:
                drainer = Scheduler(store, KafkaStarts(producer, args.topic, "/bench"), config)
                n = await drainer.run_due()
            result[phase] = {"rows": n, "start": start, "end": time.time()}
            (work / f"{args.name}.{phase}.json").write_text(json.dumps(result[phase]))
    finally:
        await store.close()
        await producer.stop()
    return 0


def burst_rate(parts: list[dict[str, Any]]) -> float:
    rows = sum(p["rows"] for p in parts)
    span = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    return rows / span if span > 0 else float("nan")


async def run_mode(args: argparse.Namespace, mode: str) -> dict[str, Any]:
    dsn = os.environ["SAGA_PG__DSN"]
    bootstrap = os.environ.get("SAGA_KAFKA__BOOTSTRAP_SERVERS", "localhost:9092")
    run_id = uuid.uuid4().hex[:8]
    schema = f"bench_sched_{run_id}"
    topic = f"bench-sched-{run_id}.inbox"
    aligned = mode == "aligned"
    await migrate(dsn, schema)
    await ensure_topics(
        KafkaSettings(bootstrap_servers=bootstrap, partitions=args.partitions), [topic]
    )
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="bench-sched-") as tmp:
        work = Path(tmp)
        try:
            conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
            try:
                started = datetime.now(UTC)
                await insert_schedules(conn, args.schedules, aligned, started)
            finally:
                await conn.close()
            log(
                f"{mode}: {args.schedules} schedules inserted; {args.engines} engines for {args.seconds:g}s"
            )
            for i in range(args.engines):
                procs.append(
                    _spawn(
                        [
                            "--engine",
                            f"e{i}",
                            "--schema",
                            schema,
                            "--topic",
                            topic,
                            "--work",
                            tmp,
                            "--seconds",
                            str(args.seconds),
                        ]
                    )
                )
            await wait_all(
                work, [f"e{i}.ticks.json" for i in range(args.engines)], args.seconds + 60
            )
            ended = started + timedelta(seconds=args.seconds)
            ticks = [
                json.loads((work / f"e{i}.ticks.json").read_text()) for i in range(args.engines)
            ]
            lateness = [x for t in ticks for x in t["lateness"]]
            ids = [x for t in ticks for x in t["ids"]]
            claims = [x for t in ticks for x in t["claims"]]
            cpu = sum(t["cpu_s"] for t in ticks)
            # Every tick from the start to 5 s before the loops stopped must have fired.
            horizon = ended - timedelta(seconds=5)
            expected = 0
            for i in range(args.schedules):
                spec = Schedule(
                    id="x",
                    saga=SAGA_TYPE,
                    every_s=60,
                    offset_s=offset_of(i, args.schedules, aligned),
                ).spec
                tick = spec.next_after(started)
                while tick <= horizon:
                    expected += 1
                    tick += timedelta(seconds=60)
            rates = {}
            for phase in ("ceiling", "drain"):
                await make_due(dsn, schema)
                (work / f"go-{phase}").touch()
                names = [f"e{i}.{phase}.json" for i in range(args.engines)]
                await wait_all(work, names, 120)
                rates[phase] = burst_rate([json.loads((work / n).read_text()) for n in names])
            for p in procs:
                p.wait(timeout=30)
            return {
                "mode": mode,
                "schedules": args.schedules,
                "engines": args.engines,
                "seconds": args.seconds,
                "ticks_fired": len(lateness),
                "ticks_expected_at_least": expected,
                "duplicates": len(ids) - len(set(ids)),
                "lateness": summary(lateness),
                "claims": len(claims),
                "mean_rows_per_claim": round(statistics.fmean(claims), 1) if claims else 0,
                "cpu_s_per_1000_ticks": round(1000 * cpu / max(1, len(lateness)), 3),
                "ceiling_rows_per_s": round(rates["ceiling"]),
                "scheduler_drain_rows_per_s": round(rates["drain"]),
                "drain_vs_ceiling": round(rates["drain"] / rates["ceiling"], 2),
            }
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
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


async def wait_all(work: Path, names: list[str], within_s: float) -> None:
    for name in names:
        await wait_file(work / name, within_s)


async def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.schedules", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--schedules", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=130.0)
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument(
        "--modes", nargs="+", choices=["spread", "aligned"], default=["spread", "aligned"]
    )
    ap.add_argument("--max-seconds", type=float, default=900.0)
    # One engine process of a run (started by the run itself).
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--schema", help=argparse.SUPPRESS)
    ap.add_argument("--topic", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if "SAGA_PG__DSN" not in os.environ:
        print("SAGA_PG__DSN is not set: run under `scripts/devstack.py env`", file=sys.stderr)
        return 2
    if args.engine:
        args.name = args.engine
        return await engine(args)
    results = []
    async with asyncio.timeout(args.max_seconds):
        for mode in args.modes:
            results.append(await run_mode(args, mode))
            log(json.dumps(results[-1]))
    print(json.dumps({"bench": "schedules", "target_p99_s": 2.0, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))

"""How long moving a range of 100,000 sagas between two Postgres clusters takes, and how
long its partitions are paused, beside the bound any move could reach (issue 43).

    python -m bench.shard_move [--sagas 100000] [--batch 500 2000 5000] [--quick]

Needs the dev stack's Postgres with a second cluster (``SAGA_DEV_PG_CLUSTERS=2 make up``,
which prints ``SAGA_DEV_PG_SHARD_DSNS``; ``--second-cluster`` names another server); no
Kafka. One run:

1. a sharded deployment of two shards made for the run: ``a`` holds every inbox partition
   in a database of its own on cluster 1 (the control tables in the same database), ``b``
   none, in one on cluster 2. Both migrated as ``saga migrate`` does;
2. ``--sagas`` sagas in the range that moves (the upper half of the partitions) and
   ``--others`` more in the rest, written through the sharded store's own write path
   (``create`` and ``append``, its group commit, many at once): three-step sagas as the
   engine records them, one row per decision (started and the first command; each reply
   and the next command; the last reply and the end), two thirds finished and the rest
   open at one of their steps; every tenth open saga queued on a concurrency key. No
   blobs (payloads are small). Then ``VACUUM ANALYZE`` of its tables (as autovacuum
   leaves a range that has lived a while: else the first move pays for it);
3. the ceiling: the range's rows of each per-saga table read with one binary ``COPY``
   from cluster 1 and written with one into a copy of the table (its indexes too) on
   cluster 2: what any move of these rows costs at least;
4. for each ``--batch``: the move of the range through ``ShardMover`` (what ``saga shard
   move`` runs), alternately from ``a`` to ``b`` and back, timed in its phases (from the
   mover's progress lines) with each cluster's CPU and the mover's own.

Progress goes to stderr; stdout gets one JSON object. See bench/README.md for the fields.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from bench.e2e import BenchError, machine, say
from bench.shards import (
    Cluster,
    add_second_cluster,
    cluster_processes,
    fill_defaults,
    find_cluster,
    second_cluster,
    with_database,
)
from saga_engine import SagaStatus, Settings
from saga_engine.events import CommandIssued, Event, ReplyReceived, SagaCompleted, SagaStarted
from saga_engine.kernel._partitioning import partition_for
from saga_engine.kernel._shards import format_partitions
from saga_engine.settings import KafkaSettings, PostgresSettings
from saga_engine.store import Append, NewSaga, Projection
from saga_engine.store._connect import connect_event_store
from saga_engine.store._databases import migrate_all
from saga_engine.store._keyslots import KeySlotStore
from saga_engine.store._pgshard_move import ShardMover
from saga_engine.store._store import EventStore

#: The tables of a saga's rows, by ``saga_id`` (what the ceiling copies).
SAGA_TABLES = ("sagas", "saga_decisions", "saga_blob_refs")
#: The tables whose rows the run counts on each shard.
COUNTED = (*SAGA_TABLES, "saga_key_slots")
STEPS = ("reserve", "charge", "ship")
SCHEMA = "saga_engine"
#: What --quick changes (unless given).
QUICK: dict[str, Any] = {"sagas": 5000, "batch": [2000]}
DEFAULTS: dict[str, Any] = {"sagas": 100_000, "batch": [2000]}
#: The mover's progress lines that end each phase (the first such line; ``copied``: the
#: last), in the order it prints them, and the phase each ends.
MARKS = (
    ("recorded the move", "record_s"),
    ("paused partitions", "pause_s"),
    ("copied ", "copy_s"),
    ("verified ", "verify_s"),
    ("committed:", "commit_s"),
    ("released partitions", "release_s"),
    ("deleted ", "delete_s"),
    ("done:", "clear_s"),
)


# --------------------------------------------------------------------------- the sagas


def saga_ids(
    run: str, sagas: int, others: int, moving: frozenset[int], partitions: int
) -> tuple[list[str], list[str]]:
    """``sagas`` ids whose partitions are in ``moving``, and ``others`` that are not."""
    inside: list[str] = []
    outside: list[str] = []
    i = 0
    while len(inside) < sagas or len(outside) < others:
        saga_id = f"move-{run}-{i}"
        i += 1
        group = inside if partition_for(saga_id, partitions) in moving else outside
        if len(group) < (sagas if group is inside else others):
            group.append(saga_id)
    return inside, outside


def decisions(saga_id: str, n: int, at: datetime) -> list[list[Event]]:
    """The decision rows the engine records for saga number ``n`` of a three-step saga:
    two thirds finished (four decisions), the others open after one to three."""
    rows: list[list[Event]] = []
    started = SagaStarted(at=at, saga_type="order", input={"order": n, "amount": n % 997})
    for k, step in enumerate(STEPS):
        command = CommandIssued(
            at=at,
            step=step,
            participant=step,
            command_type=f"{step}.do",
            payload={"order": n},
            payload_hash=f"{n:016x}",
            command_id=f"{saga_id}:{step}:1",
            attempt=1,
        )
        before = (
            [started]
            if k == 0
            else [
                ReplyReceived(
                    at=at,
                    step=STEPS[k - 1],
                    command_id=f"{saga_id}:{STEPS[k - 1]}:1",
                    outcome="success",
                    payload={"ok": True},
                )
            ]
        )
        rows.append([*before, command])
    last = ReplyReceived(
        at=at, step=STEPS[-1], command_id=f"{saga_id}:{STEPS[-1]}:1", outcome="success"
    )
    rows.append([last, SagaCompleted(at=at, output={"order": n})])
    return rows if n % 3 else rows[: 1 + n // 3 % 3]


async def write_saga(store: EventStore, saga_id: str, n: int) -> int:
    """Saga ``n``'s decisions through the store (its own write path); its rows."""
    at = datetime.now(UTC)
    rows = decisions(saga_id, n, at)
    finished = len(rows) == len(STEPS) + 1
    running = Projection(SagaStatus.RUNNING)
    await store.create(NewSaga(saga_id, "order", rows[0], running))
    seq = len(rows[0])
    for i, events in enumerate(rows[1:], start=2):
        done = finished and i == len(rows)
        projection = Projection(SagaStatus.COMPLETED) if done else running
        seq = await store.append(Append(saga_id, seq, events, projection))
    if not finished and n % 10 == 1 and isinstance(store, KeySlotStore):
        await store.acquire_key("order", f"customer-{n % 997}", saga_id, 1, at)
    return len(rows)


async def write_all(settings: Settings, ids: Sequence[str], at_once: int) -> float:
    """Every saga of ``ids`` written, ``at_once`` at a time; the seconds it took."""
    store = await connect_event_store(settings)
    started = time.monotonic()
    try:
        for start in range(0, len(ids), at_once):
            chunk = ids[start : start + at_once]
            await asyncio.gather(*(write_saga(store, s, start + i) for i, s in enumerate(chunk)))
            if (start // at_once) % 20 == 0:
                say(f"written {start + len(chunk)}/{len(ids)} sagas")
    finally:
        await store.close()
    return time.monotonic() - started


# --------------------------------------------------------------------------- the move


def phases(marks: Sequence[tuple[float, str]], started: float) -> dict[str, float | None]:
    """Each phase's seconds from the mover's timed progress lines (``MARKS``): a phase
    runs from the previous mark (the first from ``started``) to its own."""
    at: dict[str, float] = {}
    for t, line in marks:
        for prefix, phase in MARKS:
            if line.startswith(prefix) and (phase not in at or phase == "copy_s"):
                at[phase] = t
    out: dict[str, float | None] = {}
    last = started
    for _, phase in MARKS:
        if phase in at:
            out[phase] = round(at[phase] - last, 3)
            last = at[phase]
        else:
            out[phase] = None
    return out


@dataclass
class MoveRun:
    """One move of the run: its batch, where from and to, and what the mover said."""

    batch: int
    source: str
    target: str
    marks: list[tuple[float, str]] = field(default_factory=list)

    def progress(self, line: str) -> None:
        self.marks.append((time.monotonic(), line))
        if not line.startswith("copied ") or line.split("/")[0].endswith("0000"):
            say(f"  {line}")


def cpu(clusters: Sequence[Cluster]) -> dict[str, float]:
    """CPU seconds so far of each cluster's processes and of this process (the mover)."""
    out = {k: v for k, v in cluster_processes(clusters).items() if k.startswith("postgres.")}
    out["mover"] = time.process_time()
    return out


async def run_move(
    settings: Settings, run: MoveRun, moving: str, clusters: Sequence[Cluster]
) -> dict[str, Any]:
    """The move of ``moving`` for ``run``, through ``ShardMover`` as the CLI runs it."""
    cpu0 = cpu(clusters)
    started = time.monotonic()
    async with ShardMover.opened(settings.pg, batch=run.batch, progress=run.progress) as mover:
        report = await mover.move(moving, run.target)
        cpu1 = cpu(clusters)  # while the mover's backends live (their CPU goes with them)
    data = report.to_data()
    sagas = data["sagas"]
    seconds = data["seconds"]
    return {
        "batch": run.batch,
        "from": run.source,
        "to": run.target,
        "sagas": sagas,
        "rows": data["rows"],
        "seconds": seconds,
        "paused_s": data["paused_s"],
        "phases_s": phases(run.marks, started),
        "sagas_per_s": round(sagas / seconds) if seconds else None,
        "paused_sagas_per_s": round(sagas / data["paused_s"]) if data["paused_s"] else None,
        "cpu_s": {k: round(cpu1[k] - cpu0.get(k, 0.0), 2) for k in cpu1},
        "epoch": data["epoch"],
    }


# --------------------------------------------------------------------------- the ceiling


async def ceiling(source: Any, target: Any, ids: list[str]) -> dict[str, Any]:
    """The range's rows of each per-saga table, one ``COPY`` out of ``source`` and one
    into a copy of the table with its indexes on ``target`` each (dropped after)."""
    out: dict[str, Any] = {"rows": {}}
    read_s = write_s = 0.0
    for table in SAGA_TABLES:
        buffer = io.BytesIO()
        t0 = time.monotonic()
        await source.copy_from_query(
            f"SELECT * FROM {table} WHERE saga_id = ANY($1::text[])",
            ids,
            output=buffer,
            format="binary",
        )
        t1 = time.monotonic()
        buffer.seek(0)
        scratch = f"ceiling_{table}"
        await target.execute(f"CREATE TABLE {scratch} (LIKE {table} INCLUDING ALL)")
        t2 = time.monotonic()
        status = await target.copy_to_table(scratch, source=buffer, format="binary")
        t3 = time.monotonic()
        await target.execute(f"DROP TABLE {scratch}")
        out["rows"][table] = int(status.rsplit(" ", 1)[-1])
        out[f"{table}_mb"] = round(buffer.getbuffer().nbytes / 1e6, 1)
        read_s += t1 - t0
        write_s += t3 - t2
    out["read_s"] = round(read_s, 3)
    out["write_s"] = round(write_s, 3)
    out["seconds"] = round(read_s + write_s, 3)
    out["sagas_per_s"] = round(len(ids) / (read_s + write_s)) if read_s + write_s else None
    return out


async def counts(conn: Any) -> dict[str, int]:
    return {t: int(await conn.fetchval(f"SELECT count(*) FROM {t}")) for t in COUNTED}


# --------------------------------------------------------------------------- main


def deployment(a: str, b: str, partitions: int) -> Settings:
    """Two shards: ``a`` (every partition, and the control tables) at ``a``, ``b`` (none)
    at ``b``."""
    return Settings(
        pg=PostgresSettings.model_validate(
            {
                "dsn": a,
                "db_schema": SCHEMA,
                "control_dsn": a,
                "shards": [
                    {"name": "a", "partitions": f"0-{partitions - 1}", "dsn": a},
                    {"name": "b", "partitions": "", "dsn": b},
                ],
            }
        ),
        kafka=KafkaSettings(partitions=partitions),
    )


def moving_range(partitions: int) -> frozenset[int]:
    """The range that moves: the upper half of the partitions."""
    return frozenset(range(partitions // 2, partitions))


async def measure(args: argparse.Namespace, a: str, b: str, clusters: Sequence[Cluster]) -> Any:
    settings = deployment(a, b, args.partitions)
    for report in await migrate_all(settings):
        if not report.ok:
            raise BenchError(f"migrating the run's databases failed: {report}")
    moving = moving_range(args.partitions)
    inside, outside = saga_ids(
        uuid.uuid4().hex[:6], args.sagas, args.others, moving, args.partitions
    )
    write_s = await write_all(settings, [*inside, *outside], args.at_once)
    say(f"written {len(inside)} + {len(outside)} sagas in {write_s:.1f} s")
    conns = [await asyncpg.connect(dsn, server_settings={"search_path": SCHEMA}) for dsn in (a, b)]
    try:
        written: dict[str, Any] = {"on_a": await counts(conns[0])}
        t0 = time.monotonic()
        for table in COUNTED:  # as autovacuum leaves a live range: the first move no slower
            await conns[0].execute(f"VACUUM ANALYZE {table}")
        written["vacuum_s"] = round(time.monotonic() - t0, 1)
        bound = await ceiling(conns[0], conns[1], inside)
        say(f"ceiling: {bound['seconds']} s ({bound['read_s']} s out, {bound['write_s']} s in)")
        moves = []
        for i, batch in enumerate(args.batch):
            source, target = ("a", "b") if i % 2 == 0 else ("b", "a")
            say(
                f"moving partitions {format_partitions(moving)} {source} -> {target}, batch {batch}"
            )
            result = await run_move(
                settings, MoveRun(batch, source, target), format_partitions(moving), clusters
            )
            result["after"] = {"a": await counts(conns[0]), "b": await counts(conns[1])}
            say(
                f"  moved {result['sagas']} in {result['seconds']} s, paused {result['paused_s']} s"
            )
            moves.append(result)
    finally:
        for conn in conns:
            await conn.close()
    written["write_s"] = round(write_s, 1)
    return written, bound, moves


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    date = datetime.now(UTC).isoformat(timespec="seconds")
    host = machine()
    first = Settings().pg.dsn.get_secret_value()
    clusters = [await find_cluster("1", first), await find_cluster("2", second_cluster(args))]
    if clusters[0].postmaster == clusters[1].postmaster:
        raise BenchError("--second-cluster is on the first cluster: give another server")
    database = f"bench_move_{uuid.uuid4().hex[:8]}"
    made: list[str] = []
    try:
        for c in clusters:
            conn = await asyncpg.connect(c.dsn, timeout=10)
            try:
                await conn.execute(f'CREATE DATABASE "{database}"')
                made.append(c.dsn)
            finally:
                await conn.close()
        a, b = (with_database(c.dsn, database) for c in clusters)
        written, bound, moves = await measure(args, a, b, clusters)
    finally:
        if not args.keep:
            for dsn in made:
                conn = await asyncpg.connect(dsn, timeout=10)
                try:
                    await conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
                finally:
                    await conn.close()
    return {
        "benchmark": "shard-move",
        "date": date,
        "machine": host,
        "layout": {
            "a": "cluster 1: a database of its own (and the control tables)",
            "b": "cluster 2: a database of its own",
            "range": format_partitions(moving_range(args.partitions)),
        },
        "written": {
            "sagas_in_range": args.sagas,
            "sagas_elsewhere": args.others,
            "path": "the sharded store's create and append (its group commit)",
            **written,
        },
        "ceiling": bound,
        "moves": moves,
        "settings": {k: getattr(args, k) for k in ("sagas", "others", "batch", "partitions")}
        | {"quick": args.quick, "at_once": args.at_once},
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m bench.shard_move", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--sagas", type=int, help="sagas in the range that moves (default 100,000)")
    ap.add_argument("--others", type=int, help="sagas outside it (default a tenth of --sagas)")
    ap.add_argument(
        "--batch", type=int, nargs="+", help="one move per value, alternately a->b, b->a"
    )
    ap.add_argument("--quick", action="store_true", help="5,000 sagas, one move")
    ap.add_argument("--partitions", type=int, default=8, help="inbox partitions (half move)")
    ap.add_argument("--at-once", type=int, default=1000, help="sagas written at once")
    add_second_cluster(ap)
    ap.add_argument("--keep", action="store_true", help="keep the run's databases")
    ap.add_argument("--json-out", type=Path, help="also write the JSON result to this file")
    args = ap.parse_args(argv)
    fill_defaults(args, DEFAULTS, QUICK)
    if args.others is None:
        args.others = args.sagas // 10
    if args.sagas < 1 or args.others < 0 or args.at_once < 1:
        ap.error("--sagas and --at-once must be at least 1, --others at least 0")
    if min(args.batch) < 1:
        ap.error("--batch must be at least 1")
    if args.partitions < 2:
        ap.error("--partitions must be at least 2: half of them move")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        result = asyncio.run(bench(args))
    except BenchError as exc:
        print(f"bench.shard_move: {exc}", file=sys.stderr)
        return 1
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

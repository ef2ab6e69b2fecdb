"""What the insight aggregates cost: the Postgres store's group commit with and without
recording the ended runs (migration 0015), and the roll-up that adds them afterwards.

    python -m bench.insight_writes [--sagas 4000] [--concurrency 200] [--rounds 3]

Each saga is ``bench.app.Transfer``'s history written as the engine writes it: a create
(``saga_started``, the first ``command_issued``), then per step an append of its reply
and the next command, the last one ending the saga (``saga_completed``): 4 appends, 8
events. ``--concurrency`` sagas at a time, so the group commit batches them. "off"
replaces the store's ``record_ended`` with nothing; rounds alternate on/off on fresh
schemas. After an "on" round's writes, ``roll_up_insights`` adds the runs, timed apart
(``rollup_*``: what housekeeping spends in the background). Prints one JSON object: per
mode the median of the rounds' wall µs and client CPU µs per saga (pg_stat_statements
is not assumed: the difference of the two modes is the write path's cost).

It needs ``SAGA_PG__DSN`` (``scripts/devstack.py env``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from pydantic import SecretStr

from saga_engine import Settings
from saga_engine.core.history._events import (
    CommandIssued,
    Event,
    ReplyReceived,
    SagaCompleted,
    SagaStarted,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.settings import PostgresSettings
from saga_engine.store import _pginsights, _pgstore
from saga_engine.store._migrations import migrate
from saga_engine.store._pgstore import PostgresEventStore
from saga_engine.store._store import Append, NewSaga, Projection

STEPS = ("debit", "credit", "notify")
RUNNING = Projection(SagaStatus.RUNNING)


def _cmd(at: datetime, saga_id: str, step: str) -> CommandIssued:
    return CommandIssued(
        at=at,
        step=step,
        participant=step,
        command_type="Apply",
        payload={"amount": 10},
        payload_hash="h",
        command_id=f"{saga_id}/{step}",
        attempt=1,
    )


async def _one(store: PostgresEventStore, saga_id: str) -> None:
    at = datetime.now(UTC)
    first: list[Event] = [
        SagaStarted(at=at, saga_type="bench-transfer", input={"amount": 10}),
        _cmd(at, saga_id, STEPS[0]),
    ]
    await store.create(NewSaga(saga_id, "bench-transfer", first, RUNNING))
    seq = 2
    for i, step in enumerate(STEPS):
        at += timedelta(milliseconds=3)
        reply = ReplyReceived(
            at=at,
            step=step,
            command_id=f"{saga_id}/{step}",
            outcome="success",
            payload={"receipt": "r"},
        )
        last = i == len(STEPS) - 1
        nxt: Event = (
            SagaCompleted(at=at, output={"ok": True}) if last else _cmd(at, saga_id, STEPS[i + 1])
        )
        status = Projection(SagaStatus.COMPLETED) if last else RUNNING
        seq = await store.append(Append(saga_id, seq, [reply, nxt], status))


async def _round(dsn: str, args: argparse.Namespace, on: bool) -> dict[str, float]:
    schema = f"bench_{uuid.uuid4().hex[:8]}_iw"
    await migrate(dsn, schema)
    store = await PostgresEventStore.connect(PostgresSettings(dsn=SecretStr(dsn), db_schema=schema))
    original = _pginsights.record_ended

    async def nothing(conn: Any, ended: Any) -> None:
        return None

    if not on:
        setattr(_pgstore, "record_ended", nothing)  # noqa: B010 (the store's own name)
    rollup: dict[str, float] = {}
    try:
        ids = [str(uuid.uuid4()) for _ in range(args.sagas)]
        sem = asyncio.Semaphore(args.concurrency)

        async def run(saga_id: str) -> None:
            async with sem:
                await _one(store, saga_id)

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(run(i) for i in ids))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        if on:
            cpu0, t0 = time.process_time(), time.perf_counter()
            while await store.roll_up_insights():
                pass
            rollup = {
                "rollup_wall_us_per_saga": (time.perf_counter() - t0) / args.sagas * 1e6,
                "rollup_cpu_us_per_saga": (time.process_time() - cpu0) / args.sagas * 1e6,
            }
    finally:
        setattr(_pgstore, "record_ended", original)  # noqa: B010
        await store.close()
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        finally:
            await conn.close()
    return {
        "wall_us_per_saga": wall / args.sagas * 1e6,
        "cpu_us_per_saga": cpu / args.sagas * 1e6,
        **rollup,
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    dsn = Settings().pg.dsn.get_secret_value()
    results: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    await _round(dsn, args, True)  # warm-up, not counted
    for _ in range(args.rounds):
        for mode in ("off", "on"):
            results[mode].append(await _round(dsn, args, mode == "on"))
            print(f"{mode}: {results[mode][-1]}", file=sys.stderr)
    out: dict[str, Any] = {"benchmark": "insight_writes", "settings": vars(args)}
    for mode, rounds in results.items():
        out[mode] = {k: round(statistics.median(r[k] for r in rounds), 1) for k in rounds[0]}
    out["extra"] = {k: round(out["on"][k] - out["off"][k], 1) for k in out["off"]}
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.insight_writes")
    ap.add_argument("--sagas", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    print(json.dumps(asyncio.run(bench(ap.parse_args(argv))), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The Postgres event store's writes per saga, counted: WAL records, rows, index entries
and statements, for three-step sagas driven through the real ``Engine`` (the testing
kit's in-memory bus and virtual clock) on the real ``PostgresEventStore``.

No Kafka and no participants: what it counts is the engine's own database work, which
``bench/e2e.py``'s ``pg_wal_records_per_saga`` mixes with the participants' and with
whatever else the cluster writes. The sagas go in waves as the worker's inbox hands
them over: ``--batch`` starts as one ``Engine.apply``, then each round of their replies
as one (every first step's, every second's...), so each wave is one group-committed
transaction per round, as under load; then the insights' roll-up (the engine's
housekeeping) adds the finished runs. The figures are counts, not times: the same on a
busy machine as on a quiet one (a checkpoint or autovacuum in the window can add a few
records; the breakdown names them).

    python -m bench.store_rows [--sagas 512] [--batch 64]

Needs ``SAGA_PG__DSN`` (``make up; source .dev/env``) and the ``pg_walinspect``
extension (shipped with Postgres since 15; created if missing): the WAL's records
between two LSNs, by kind and by the relation they touch.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import uuid
from collections import Counter
from typing import Any

import asyncpg
import orjson

from bench.app import Transfer
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.core.runtime._start import StartRequest
from saga_engine.runner._path_inputs import Deliver, Start
from saga_engine.settings import Settings
from saga_engine.store import PostgresEventStore, migrate
from saga_engine.testing import SagaTestEnv

#: The relations a WAL record touches: ``rel <tablespace>/<db>/<filenode>``.
_BLOCK_REF = re.compile(r"rel \d+/\d+/(\d+)")


def _statement(query: str) -> str:
    """A statement's name in the breakdown: its first words, up to the first table."""
    words = " ".join(query.split()).split(" ")
    head = []
    for word in words[:12]:
        head.append(word)
        if word.lower() in {"into", "from", "update", "table"} and len(head) < len(words):
            nxt = words[len(head)]
            head.append(nxt)
            break
    return " ".join(head)[:60]


async def _relations(conn: asyncpg.Connection[Any], schema: str) -> dict[str, str]:
    rows = await conn.fetch(
        "SELECT pg_relation_filenode(c.oid)::text AS node, c.relname, c.relkind "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = $1 AND pg_relation_filenode(c.oid) IS NOT NULL",
        schema,
    )
    return {r["node"]: r["relname"] for r in rows}


async def _lsn(conn: asyncpg.Connection[Any]) -> str:
    """Where the WAL is flushed to: every committed write is before it (pg_walinspect
    reads no further)."""
    lsn: str = await conn.fetchval("SELECT pg_current_wal_flush_lsn()::text")
    return lsn


def _commands(env: SagaTestEnv) -> list[OutboundCommand]:
    out = list(env.bus.pending)
    env.bus.pending.clear()
    return out


async def _drive(env: SagaTestEnv, offset: int, sagas: int, batch: int | None = None) -> None:
    """Runs ``sagas`` sagas (ids from ``offset`` on) in waves of ``batch``."""
    engine = env.engine
    batch = batch or sagas
    for first in range(0, sagas, batch):
        ids = [str(uuid.UUID(int=k + 1 + offset)) for k in range(first, min(sagas, first + batch))]
        starts = [
            Start(i, engine.prepare(StartRequest(Transfer.name, {"amount": 1}, i))) for i in ids
        ]
        for outcome in await engine.apply(starts):
            outcome.result()
        while commands := _commands(env):
            inputs = [
                Deliver(c.saga_id, engine.reply_input(c.command_id, "success", {"receipt": "r"}))
                for c in commands
            ]
            for outcome in await engine.apply(inputs):
                outcome.result()


async def measure(dsn: str, sagas: int, batch: int) -> dict[str, Any]:
    schema = f"bench_rows_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        await admin.execute(f'CREATE SCHEMA "{schema}"')
        await migrate(admin, schema)
        settings = Settings.model_validate(
            {"pg": {"dsn": dsn, "db_schema": schema, "pool_min_size": 2, "pool_max_size": 2}}
        )
        store = await PostgresEventStore.connect(settings.pg)
        statements: Counter[str] = Counter()
        # Every statement the store's connections send (both held at once, so both get
        # the logger; a pool keeps a connection's loggers across acquires).
        pool = store._pool
        held = [await pool.acquire() for _ in range(2)]
        for conn in held:
            conn.add_query_logger(lambda q: statements.update([_statement(q.query)]))
        for conn in held:
            await pool.release(conn)
        env = SagaTestEnv([Transfer], settings=settings, store=store)
        try:
            await _drive(env, sagas, min(batch, 8))  # warm the statement caches
            statements.clear()
            await admin.execute("CHECKPOINT")
            # A temporary slot keeps the window's WAL until it is read, however much
            # other sessions write meanwhile (it goes with this connection).
            await admin.execute(
                "SELECT pg_create_physical_replication_slot($1, true, true)", schema
            )
            lsn0 = await _lsn(admin)
            await _drive(env, 0, sagas, batch)
            while await store.roll_up_insights() > 0:
                pass
            lsn1 = await _lsn(admin)
            completed = await admin.fetchval(
                f"SELECT count(*) FROM \"{schema}\".sagas WHERE status = 'completed'"
            )
            relations = await _relations(admin, schema)
            records = await admin.fetch(
                "SELECT resource_manager || '/' || split_part(record_type, ' ', 1) AS kind, "
                "block_ref, record_length AS size, xid::text::int8 AS xid FROM "
                "pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)",
                lsn0,
                lsn1,
            )
        finally:
            await env.engine.close()
            await store.close()
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()
    return _report(sagas, batch, completed - min(batch, 8), records, relations, statements)


def _report(
    sagas: int,
    batch: int,
    completed: int,
    records: list[asyncpg.Record],
    relations: dict[str, str],
    statements: Counter[str],
) -> dict[str, Any]:
    # The store's records: those that touch the schema's relations, and every other
    # record of their transactions (their commits). The rest (another session's writes,
    # a checkpoint) are counted apart.
    touching = [
        bool(relations.keys() & set(_BLOCK_REF.findall(r["block_ref"] or ""))) for r in records
    ]
    xids = {r["xid"] for r, t in zip(records, touching, strict=True) if t} - {0}
    mine = [r for r, t in zip(records, touching, strict=True) if t or r["xid"] in xids]
    kinds: Counter[str] = Counter()
    by_relation: dict[str, Counter[str]] = {}
    for r in mine:
        kinds[r["kind"]] += 1
        nodes = sorted(set(_BLOCK_REF.findall(r["block_ref"] or ""))) or ["-"]
        name = "+".join(relations.get(n, "(other)") for n in nodes)
        by_relation.setdefault(name, Counter())[r["kind"]] += 1
    transactions = kinds["Transaction/COMMIT"]

    def per(counter: Counter[str], unit: int) -> dict[str, float]:
        return {k: round(v / unit, 2) for k, v in counter.most_common() if v}

    return {
        "sagas": sagas,
        "batch": batch,
        "completed": completed,
        "wal_records_per_saga": round(len(mine) / sagas, 2),
        "wal_bytes_per_saga": round(sum(r["size"] for r in mine) / sagas),
        "other_wal_records_in_the_window": len(records) - len(mine),
        "transactions_per_saga": round(transactions / sagas, 3),
        "wal_records_by_kind_per_saga": per(kinds, sagas),
        "wal_records_by_relation_per_saga": {
            name: {"total": round(sum(c.values()) / sagas, 2), **per(c, sagas)}
            for name, c in sorted(by_relation.items(), key=lambda kv: -sum(kv[1].values()))
        },
        "statements_per_transaction": per(statements, max(transactions, 1)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sagas", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dsn", default=None, help="default: SAGA_PG__DSN")
    args = parser.parse_args(argv)
    dsn = args.dsn or Settings().pg.dsn.get_secret_value()
    report = asyncio.run(measure(dsn, args.sagas, args.batch))
    sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")


if __name__ == "__main__":
    main()

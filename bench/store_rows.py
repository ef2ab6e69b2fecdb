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
import sys
import uuid
from collections import Counter
from typing import Any

import asyncpg
import orjson

from bench.app import Transfer
from bench.wal_window import WalCounts, WalWindow
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.core.runtime._start import StartRequest
from saga_engine.runner._path_inputs import Deliver, Start
from saga_engine.settings import Settings
from saga_engine.store import PostgresEventStore, migrate
from saga_engine.testing import SagaTestEnv


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


#: The prototype of one history row per decision (``--decision-rows``): the events one
#: append wrote, as one jsonb array, beside a copy of today's one row per event, each
#: with its table's indexes (the primary key; the partial indexes of migrations 0011 and
#: 0019, which no event of these sagas enters).
_PROTOTYPE = """
CREATE TABLE proto_event_rows (LIKE saga_events INCLUDING DEFAULTS, PRIMARY KEY (saga_id, seq));
CREATE INDEX ON proto_event_rows (saga_id, seq) WHERE kind = 'run_continued';
CREATE INDEX ON proto_event_rows ((data ->> 'source'), (data ->> 'key'))
    WHERE kind = 'event_awaited';
CREATE TABLE proto_decision_rows (
    saga_id text COLLATE "C" NOT NULL, seq int NOT NULL, last_seq int NOT NULL,
    kinds text[] NOT NULL, events jsonb NOT NULL, recorded_at timestamptz NOT NULL,
    PRIMARY KEY (saga_id, seq));
CREATE INDEX ON proto_decision_rows (saga_id, seq) WHERE 'run_continued' = ANY (kinds);
"""
#: The history as the store wrote it: one group per transaction (its recorded_at).
_WRITTEN = """
SELECT recorded_at, array_agg(saga_id ORDER BY saga_id, seq) AS ids,
       array_agg(seq ORDER BY saga_id, seq) AS seqs, array_agg(kind ORDER BY saga_id, seq) AS kinds,
       array_agg(data::text ORDER BY saga_id, seq) AS data
FROM saga_events GROUP BY recorded_at ORDER BY recorded_at
"""
_COPY_EVENTS = """
INSERT INTO proto_event_rows (saga_id, seq, kind, data, recorded_at)
SELECT u.saga_id, u.seq, u.kind, u.data::jsonb, $5
FROM unnest($1::text[], $2::int[], $3::text[], $4::text[]) AS u(saga_id, seq, kind, data)
"""
_COPY_DECISIONS = """
INSERT INTO proto_decision_rows (saga_id, seq, last_seq, kinds, events, recorded_at)
SELECT u.saga_id, min(u.seq), max(u.seq), array_agg(u.kind ORDER BY u.seq),
       jsonb_agg(u.data::jsonb ORDER BY u.seq), $5
FROM unnest($1::text[], $2::int[], $3::text[], $4::text[]) AS u(saga_id, seq, kind, data)
GROUP BY u.saga_id
"""


async def _decision_rows(conn: asyncpg.Connection[Any], schema: str, sagas: int) -> dict[str, Any]:
    """WAL records and bytes per saga of the measured sagas' histories written again, one
    statement per transaction the store wrote, as one row per event and as one row per
    decision (prototype tables in the schema)."""
    await conn.execute(f'SET search_path = "{schema}", public')
    await conn.execute(_PROTOTYPE)
    groups = await conn.fetch(_WRITTEN)
    out: dict[str, Any] = {}
    for name, statement, table in (
        ("one_row_per_event", _COPY_EVENTS, "proto_event_rows"),
        ("one_row_per_decision", _COPY_DECISIONS, "proto_decision_rows"),
    ):
        window = WalWindow(conn)
        await window.open()
        for g in groups:
            await conn.execute(
                statement, g["ids"], g["seqs"], g["kinds"], g["data"], g["recorded_at"]
            )
        counts = await window.read({schema: ""})
        mine = {
            key: cell
            for key, cell in counts.cells.items()
            if key[0] is not None and key[0].startswith(table)
        }
        out[name] = {
            "rows_per_saga": round(await conn.fetchval(f"SELECT count(*) FROM {table}") / sagas, 2),
            "wal_records_per_saga": round(sum(r for r, _b in mine.values()) / sagas, 2),
            "wal_bytes_per_saga": round(sum(b for _r, b in mine.values()) / sagas),
        }
    return out


async def measure(dsn: str, sagas: int, batch: int, decision_rows: bool = False) -> dict[str, Any]:
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
            await admin.execute(f'DELETE FROM "{schema}".saga_decisions')  # the prototype's input
            statements.clear()
            await admin.execute("CHECKPOINT")
            window = WalWindow(admin)
            await window.open()
            await _drive(env, 0, sagas, batch)
            while await store.roll_up_insights() > 0:
                pass
            counts = await window.read({schema: ""})
            completed = await admin.fetchval(
                f"SELECT count(*) FROM \"{schema}\".sagas WHERE status = 'completed'"
            )
            prototype = await _decision_rows(admin, schema, sagas) if decision_rows else None
        finally:
            await env.engine.close()
            await store.close()
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await admin.close()
    report = _report(sagas, batch, completed - min(batch, 8), counts, statements)
    if prototype is not None:
        report["decision_rows_prototype"] = prototype
    return report


def _report(
    sagas: int, batch: int, completed: int, counts: WalCounts, statements: Counter[str]
) -> dict[str, Any]:
    transactions = counts.by_kind()["Transaction/COMMIT"]
    wal = counts.per_saga(sagas)
    return {
        "sagas": sagas,
        "batch": batch,
        "completed": completed,
        **wal,
        "transactions_per_saga": round(transactions / sagas, 3),
        "statements_per_transaction": {
            k: round(v / max(transactions, 1), 2) for k, v in statements.most_common() if v
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sagas", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--dsn", default=None, help="default: SAGA_PG__DSN")
    parser.add_argument(
        "--decision-rows",
        action="store_true",
        help="also write the measured histories again as one row per event and as one row "
        "per decision (prototype tables) and count each one's WAL",
    )
    args = parser.parse_args(argv)
    dsn = args.dsn or Settings().pg.dsn.get_secret_value()
    report = asyncio.run(measure(dsn, args.sagas, args.batch, args.decision_rows))
    sys.stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")


if __name__ == "__main__":
    main()

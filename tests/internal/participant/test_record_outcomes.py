"""The outcomes' insert (``_sql.RECORD_OUTCOMES``) on the real Postgres: the optimistic
pass's claim. An id stored before the insert is skipped; one stored by a transaction
that commits while the insert waits for it fails the insert with a unique violation.
Both are the same answer, ClaimLost (the batch then goes again the locked way)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from aiokafka.structs import TopicPartition

from saga_engine.participant._reading import Item
from saga_engine.participant._sql import RECORD_OUTCOMES, reply_record
from saga_engine.participant._transaction import ClaimLost, _record
from saga_engine.store._migrations import PARTICIPANT_MIGRATIONS, migrate
from saga_engine.transport._wire import ReplyBody
from tests.conftest import PgTarget
from tests.participant.helpers import command
from tests.waiting import eventually

pytestmark = pytest.mark.integration

_STORE = (
    "INSERT INTO saga_processed_commands (command_id, saga_id, command_type, step, outcome, "
    "reply) VALUES ($1, 's', 'Book', 'book', 'success', '{}')"
)


def _item(command_id: str) -> Item:
    cmd = command("Book", {"amount": 1}, command_id=command_id)
    reply = ReplyBody(outcome="success", payload={})
    out = reply_record(cmd, reply, source="/test", topic="replies", codec=None)
    return Item(TopicPartition("commands", 0), None, command=cmd, outgoing=out)


async def _stored(conn: asyncpg.Connection[asyncpg.Record]) -> list[str]:
    rows = await conn.fetch("SELECT command_id FROM saga_processed_commands ORDER BY 1")
    return [r["command_id"] for r in rows]


async def test_fresh_outcomes_are_stored_and_a_stored_one_is_a_lost_claim(pg: PgTarget) -> None:
    await migrate(pg.database_dsn, pg.schema, package=PARTICIPANT_MIGRATIONS)
    conn = await asyncpg.connect(pg.dsn)
    try:
        async with conn.transaction():
            await _record(conn, [_item("b"), _item("a")])  # type: ignore[arg-type]
        await conn.execute(_STORE, "c")
        with pytest.raises(ClaimLost):
            async with conn.transaction():
                await _record(conn, [_item("d"), _item("c")])  # type: ignore[arg-type]
        assert await _stored(conn) == ["a", "b", "c"]
    finally:
        await conn.close()


async def test_an_outcome_stored_meanwhile_by_another_transaction_is_a_lost_claim(
    pg: PgTarget,
) -> None:
    await migrate(pg.database_dsn, pg.schema, package=PARTICIPANT_MIGRATIONS)
    first = await asyncpg.connect(pg.dsn)
    second = await asyncpg.connect(pg.dsn)
    try:
        other = first.transaction()
        await other.start()
        await first.execute(_STORE, "x")

        async def insert() -> None:
            async with second.transaction():
                await _record(second, [_item("x")])  # type: ignore[arg-type]

        racing = asyncio.ensure_future(insert())

        async def waiting() -> bool:
            locks = await first.fetchval(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = $1",
                second.get_server_pid(),
            )
            return bool(locks)

        await eventually(waiting)
        await other.commit()
        with pytest.raises(ClaimLost) as lost:
            await racing
        assert isinstance(lost.value.__cause__, asyncpg.UniqueViolationError)
        assert await _stored(first) == ["x"]
    finally:
        await first.close()
        await second.close()


async def test_the_check_probes_the_primary_key_per_row_whatever_the_statistics(
    pg: PgTarget,
) -> None:
    """A batch of 2,000 against 200,000 stored rows never analyzed: one probe of the
    primary key per command, no scan of the table (an anti-join hashed it against one)."""
    await migrate(pg.database_dsn, pg.schema, package=PARTICIPANT_MIGRATIONS)
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute(
            "INSERT INTO saga_processed_commands (command_id, saga_id, command_type, step, "
            "outcome, reply) SELECT 'c' || g, 's', 'Book', 'book', 'success', '{}' "
            "FROM generate_series(1, 200000) AS g"
        )
        n = 2000
        rows = await conn.fetch(
            "EXPLAIN " + RECORD_OUTCOMES,
            [f"new-{k}" for k in range(n)],
            ["s"] * n,
            ["Book"] * n,
            ["book"] * n,
            ["success"] * n,
            ["{}"] * n,
            [None] * n,
        )
    finally:
        await conn.close()
    plan = "\n".join(r[0] for r in rows)
    assert "Index Only Scan using saga_processed_commands_pkey" in plan, plan
    assert "Seq Scan" not in plan, plan

"""Recovery in-process on the real Postgres: drop an engine mid-flight, start a new one.

The transport here is the in-memory command bus (Kafka arrives with the transport
issue); the event store is the real Postgres adapter with group commit.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest

from saga_engine import PostgresSettings, SagaStatus
from saga_engine.store import PostgresEventStore, migrate, shipped_migrations
from saga_engine.testing import SagaTestEnv
from tests.conftest import PgTarget
from tests.sagas import (
    OrderRequest,
    PlaceOrder,
    QuoteShipping,
    ReserveStock,
    ShippingQuote,
    StockReserved,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def pg_settings(pg: PgTarget) -> PostgresSettings:
    settings = PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema)
    await migrate(pg.database_dsn, pg.schema)
    return settings


@pytest.fixture
async def store(pg_settings: PostgresSettings) -> AsyncIterator[PostgresEventStore]:
    s = await PostgresEventStore.connect(pg_settings)
    yield s
    await s.close()


def _script(env: SagaTestEnv) -> None:
    env.participant("inventory").on(ReserveStock, reply=StockReserved(reservation="r"))
    env.participant("shipping").on(QuoteShipping, reply=ShippingQuote(price=3))


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_new_engine_finishes_what_a_dropped_one_started(
    seed: int, store: PostgresEventStore, pg_settings: PostgresSettings
) -> None:
    rng = random.Random(seed)
    env = SagaTestEnv([PlaceOrder], store=store)
    _script(env)
    runs = []
    for i in range(12):
        order = OrderRequest(customer=f"c{i}", total=10 + i, needs_approval=rng.random() < 0.3)
        saga_id = await env.engine.start(PlaceOrder, order)
        runs.append((saga_id, order))
    # Drive them part way: deliver a random prefix of the queued commands only.
    delivered = rng.randint(3, len(env.bus.pending))
    pending_before = list(env.bus.pending)
    env.bus.pending.clear()
    env.bus.pending.extend(pending_before[:delivered])
    await env.settle()
    lost_in_flight = pending_before[delivered:]  # sent, never answered: the crash eats them

    # The engine object is dropped without any shutdown, as a crash would.
    old_engine = env.engine
    new_store = await PostgresEventStore.connect(pg_settings)
    try:
        env.engine = env.new_engine(store=new_store)
        del old_engine
        recovered = await env.engine.recover()
        open_before = [sid for sid, _ in runs]
        assert recovered == len(await new_store.open_saga_ids()) <= len(open_before)
        resent = {c.command_id for c in env.bus.pending}
        assert {c.command_id for c in lost_in_flight} <= resent, "in-flight commands go out again"
        await env.settle()
        for saga_id, order in runs:
            if order.needs_approval:
                record = await new_store.get(saga_id)
                if record.status == SagaStatus.RUNNING:
                    await env.engine.signal(saga_id, "approval", {"approved": True, "by": "ops"})
                    await env.settle()
        await env.advance(timedelta(hours=5))
        for saga_id, _ in runs:
            record = await new_store.get(saga_id)
            assert record.status == SagaStatus.COMPLETED, (saga_id, record)
    finally:
        await new_store.close()

    # No command id was ever issued for two different payloads.
    by_id: dict[str, set[bytes]] = {}
    import orjson

    for command in env.bus.sent:
        by_id.setdefault(command.command_id, set()).add(
            orjson.dumps(command.payload, option=orjson.OPT_SORT_KEYS)
        )
    assert all(len(payloads) == 1 for payloads in by_id.values())

    # Histories in Postgres are dense and start at 1.
    conn = await asyncpg.connect(pg_settings.dsn.get_secret_value())
    try:
        await conn.execute(f'SET search_path TO "{pg_settings.db_schema}"')
        rows = await conn.fetch(
            "SELECT saga_id, array_agg(seq ORDER BY seq) AS seqs FROM saga_events GROUP BY saga_id"
        )
    finally:
        await conn.close()
    assert len(rows) == len(runs)
    for row in rows:
        assert list(row["seqs"]) == list(range(1, len(row["seqs"]) + 1))


async def test_stale_engine_cannot_append_after_another_took_over(
    store: PostgresEventStore, pg_settings: PostgresSettings
) -> None:
    env = SagaTestEnv([PlaceOrder], store=store)
    _script(env)
    saga_id = await env.engine.start(PlaceOrder, OrderRequest(customer="c", total=5))
    first = env.bus.pending.popleft()
    stale = env.engine
    other_store = await PostgresEventStore.connect(pg_settings)
    try:
        fresh = env.new_engine(store=other_store)
        await fresh.recover()
        await fresh.reply(saga_id, first.command_id, "success")  # the new owner moves on
        sent_before = len(env.bus.sent)
        from saga_engine import ConcurrencyError

        with pytest.raises(ConcurrencyError, match="another writer got there first"):
            await stale.reply(saga_id, first.command_id, "success")
        assert len(env.bus.sent) == sent_before, "the stale owner sends nothing"
        assert stale.runtime_of(saga_id) is None, "and lets go of the saga"
    finally:
        await other_store.close()


def test_cli_migrate_applies_then_reports_up_to_date(pg: PgTarget) -> None:
    import os

    from typer.testing import CliRunner

    from saga_engine.cli import app

    env = {"SAGA_PG__DSN": pg.database_dsn, "SAGA_PG__DB_SCHEMA": pg.schema + "_cli"}
    runner = CliRunner()
    try:
        first = runner.invoke(app, ["migrate", "--json"], env={**os.environ, **env})
        assert first.exit_code == 0, first.output
        shipped = [m.version for m in shipped_migrations()]
        assert orjson_loads(first.stdout)["applied"] == shipped
        second = runner.invoke(app, ["migrate"], env={**os.environ, **env})
        assert second.exit_code == 0
        assert "up to date" in second.stdout
        sql = runner.invoke(app, ["migrate", "--sql"])
        assert "CREATE TABLE" in sql.stdout
        assert "step_stuck" in sql.stdout
    finally:
        # A schema of its own, outside the fixture's: dropped even when the test fails.
        asyncio.run(_drop_schema(pg.database_dsn, env["SAGA_PG__DB_SCHEMA"]))


async def _drop_schema(dsn: str, schema: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    finally:
        await conn.close()


def orjson_loads(text: str) -> dict[str, object]:
    import orjson

    value = orjson.loads(text)
    assert isinstance(value, dict)
    return value

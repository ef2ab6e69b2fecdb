"""An engine past one database: a real worker whose store is sharded over two Postgres
clusters of their own (the devstack's), with the control database on a third."""

from __future__ import annotations

import json
from collections.abc import Sequence

import asyncpg
import httpx
import pytest
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.protocol import partition_for
from saga_engine.settings import AdminSettings, EngineSettings, KafkaSettings, PostgresSettings
from saga_engine.store import migrate
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.integration.kafka_helpers import fake_participant

pytestmark = pytest.mark.integration

PARTITIONS = 4
RANGES = {"a": "0-1", "b": "2-3"}


class Order(BaseModel):
    n: int


class Done(BaseModel):
    ok: bool = True


class Cmd(BaseModel):
    n: int


class Two(Saga[Order, Done]):
    name = "sharded-two"

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        await ctx.step("first", to="alpha", command=Cmd(n=input.n), compensate=Cmd(n=-input.n))
        await ctx.step("second", to="alpha", command=Cmd(n=input.n))
        return Done()


def _settings(
    pg: PgTarget, shard_dsns: Sequence[str], kafka_bootstrap: str, unique_id: str
) -> Settings:
    shards = [
        {"name": name, "partitions": RANGES[name], "dsn": dsn}
        for name, dsn in zip(RANGES, shard_dsns, strict=True)
    ]
    return Settings(
        pg=PostgresSettings.model_validate(
            {
                "dsn": pg.database_dsn,
                "db_schema": pg.schema,
                "shards": shards,
                "control_dsn": pg.database_dsn,
            }
        ),
        kafka=KafkaSettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=f"t{unique_id}",
            group_id=f"engines-{unique_id}",
            partitions=PARTITIONS,
        ),
        engine=EngineSettings(),
        admin=AdminSettings(port=0),
    )


async def _saga_ids(dsn: str, schema: str) -> set[str]:
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        return {r["saga_id"] for r in await conn.fetch("SELECT saga_id FROM sagas")}
    finally:
        await conn.close()


async def test_each_saga_lives_in_its_partitions_shard_and_the_engine_reads_across(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...], kafka_bootstrap: str, unique_id: str
) -> None:
    shard_a, shard_b = pg_shards[:2]
    settings = _settings(
        pg, [shard_a.database_dsn, shard_b.database_dsn], kafka_bootstrap, unique_id
    )
    worker = SagaWorker(settings, [Two])
    await worker.start()
    try:
        async with fake_participant(settings, "alpha"), SagaClient(settings) as client:
            ids = [await client.start(Two, Order(n=n)) for n in range(12)]
            for saga_id in ids:
                await client.result(saga_id, timeout=60)
            listed = await worker.parts.store.list_sagas(limit=100)
    finally:
        await worker.stop()
    assert sorted(r.saga_id for r in listed) == sorted(ids)
    assert {r.status for r in listed} == {SagaStatus.COMPLETED}
    in_a = await _saga_ids(shard_a.database_dsn, shard_a.schema)
    in_b = await _saga_ids(shard_b.database_dsn, shard_b.schema)
    assert in_a | in_b == set(ids)
    assert not in_a & in_b
    for saga_id in ids:
        expected = "a" if partition_for(saga_id, PARTITIONS) <= 1 else "b"
        assert saga_id in (in_a if expected == "a" else in_b)
    # Both shards held some: a map that sent everything to one would not show here.
    assert in_a
    assert in_b
    # The control database holds the map and no saga.
    assert await _saga_ids(pg.database_dsn, pg.schema) == set()
    conn = await asyncpg.connect(pg.database_dsn, server_settings={"search_path": pg.schema})
    try:
        row = await conn.fetchrow("SELECT epoch, map FROM shard_map ORDER BY epoch DESC LIMIT 1")
    finally:
        await conn.close()
    assert row is not None
    assert row["epoch"] == 1
    assert json.loads(row["map"])["shards"] == RANGES


async def test_while_a_shard_does_not_answer_the_others_sagas_complete_and_lists_say_so(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...], kafka_bootstrap: str, unique_id: str
) -> None:
    shard_a = pg_shards[0]
    # Shard b's address has nothing listening (a cluster stopped for good).
    dead = "postgresql://postgres@127.0.0.1:9/saga"
    settings = _settings(pg, [shard_a.database_dsn, dead], kafka_bootstrap, unique_id)
    # Migrated by hand: the engine's own migration would wait for shard b.
    settings = settings.model_copy(
        update={"engine": settings.engine.model_copy(update={"auto_migrate": False})}
    )
    await migrate(pg.database_dsn, pg.schema)
    await migrate(shard_a.database_dsn, shard_a.schema)
    worker = SagaWorker(settings, [Two])
    await worker.start()
    try:
        async with fake_participant(settings, "alpha"), SagaClient(settings) as client:
            on_a = [f"order-{n}" for n in range(40) if partition_for(f"order-{n}", PARTITIONS) <= 1]
            on_b = [f"order-{n}" for n in range(40) if partition_for(f"order-{n}", PARTITIONS) > 1]
            # A start for shard b first: its partition waits, the engine's others go on.
            await client.start(Two, Order(n=1), saga_id=on_b[0])
            for saga_id in on_a[:5]:
                await client.start(Two, Order(n=1), saga_id=saga_id)
            for saga_id in on_a[:5]:
                await client.result(saga_id, timeout=60)
            assert worker.admin_url is not None
            async with httpx.AsyncClient(base_url=worker.admin_url, timeout=30) as http:
                response = await http.get("/sagas", params={"sort": "id"})
                health = (await http.get("/health")).json()
        assert response.status_code == 200
        page = response.json()
        assert sorted(item["saga_id"] for item in page["items"]) == sorted(on_a[:5])
        assert [m["shard"] for m in page["missing_shards"]] == ["b"]
        # /health: degraded (a restart would not cure it), naming the shard.
        assert health["status"] == "degraded"
        assert [p for p in health["problems"] if "shard 'b'" in p]
    finally:
        await worker.stop()
    # The dead shard's address never shows in an answer.
    assert "127.0.0.1:9" not in json.dumps(page)

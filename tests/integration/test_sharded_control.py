"""Past one database, what is not per saga lives in the control database and works with
the sagas of every shard: rollouts set through the admin API reach new sagas of both
shards, a schedule with overlap=skip waits for its previous saga on a shard, a batch
operation reaches the sagas of both shards, and payloads by reference keep their blobs
in their saga's shard until the saga is pruned. Real engines, Kafka, and three Postgres
clusters: the control database on the first, the two shards on the others."""

from __future__ import annotations

import base64
import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import asyncpg
import httpx
import pytest
from pydantic import BaseModel, SecretStr

from saga_engine import Saga, SagaContext, SagaStatus, Settings, Signal
from saga_engine.client import SagaClient
from saga_engine.protocol import partition_for
from saga_engine.schedules import Overlap, Schedule
from saga_engine.settings import (
    AdminSettings,
    BatchSettings,
    BlobSettings,
    CodecSettings,
    EngineSettings,
    KafkaSettings,
    ParticipantSettings,
    PostgresSettings,
    RetentionSettings,
    ScheduleSettings,
)
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.waiting import eventually

pytestmark = pytest.mark.integration

PARTITIONS = 4
RANGES = {"a": "0-1", "b": "2-3"}
TOKEN = "operator-token-0123456789-abcdef"
OPERATOR = {"Authorization": f"Bearer {TOKEN}"}
MAC = base64.b64encode(b"a MAC key of 32 bytes, for tests").decode()


class Order(BaseModel):
    pdf: str = ""


class Done(BaseModel):
    version: int


class Go(BaseModel):
    pass


class OrderV1(Saga[Order, Done]):
    name = "control-order"

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        return Done(version=1)


class OrderV2(Saga[Order, Done]):
    name = "control-order"
    version = 2

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        return Done(version=2)


class Waits(Saga[Order, Done]):
    """Runs until it is signalled ``go``."""

    name = "control-waits"
    go = Signal(Go)

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        await ctx.wait_signal(self.go)
        return Done(version=1)


def _settings(
    pg: PgTarget, shards: Sequence[PgTarget], kafka_bootstrap: str, unique_id: str, **more: Any
) -> Settings:
    return Settings(
        pg=PostgresSettings.model_validate(
            {
                "dsn": pg.database_dsn,
                "db_schema": pg.schema,
                "shards": [
                    {"name": name, "partitions": RANGES[name], "dsn": shard.database_dsn}
                    for name, shard in zip(RANGES, shards, strict=True)
                ],
                "control_dsn": pg.database_dsn,
            }
        ),
        kafka=KafkaSettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=f"t{unique_id}",
            group_id=f"engines-{unique_id}",
            partitions=PARTITIONS,
        ),
        admin=AdminSettings(port=0, operators={"olivia": SecretStr(TOKEN)}),
        **more,
    )


def _on_each_shard(prefix: str, per_shard: int) -> list[str]:
    """Saga ids, ``per_shard`` of them in each shard's partitions."""
    ids: dict[str, list[str]] = {"a": [], "b": []}
    n = 0
    while min(len(v) for v in ids.values()) < per_shard:
        saga_id = f"{prefix}-{n}"
        shard = "a" if partition_for(saga_id, PARTITIONS) <= 1 else "b"
        if len(ids[shard]) < per_shard:
            ids[shard].append(saga_id)
        n += 1
    return ids["a"] + ids["b"]


async def _fetch(target: PgTarget, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(
        target.database_dsn, server_settings={"search_path": target.schema}
    )
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def _count(target: PgTarget, table: str) -> int:
    [row] = await _fetch(target, f"SELECT count(*) AS n FROM {table}")
    return int(row["n"])


async def _status(worker: SagaWorker, saga_id: str) -> SagaStatus | None:
    try:
        return (await worker.parts.store.get(saga_id)).status
    except Exception:
        return None


async def _all_running(worker: SagaWorker, ids: Sequence[str]) -> None:
    async def running() -> bool:
        return [await _status(worker, i) for i in ids] == [SagaStatus.RUNNING] * len(ids)

    await eventually(running)


async def test_a_rollout_set_through_the_api_lives_in_the_control_database_and_new_sagas_run_it(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...], kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(pg, pg_shards, kafka_bootstrap, unique_id)
    async with SagaWorker(settings, [OrderV1, OrderV2]) as first:
        assert first.admin_url is not None
        async with httpx.AsyncClient(base_url=first.admin_url, timeout=30) as http:
            put = await http.put(
                "/rollouts/control-order",
                json={"version": 2, "percent": 100, "reason": "all in"},
                headers=OPERATOR,
            )
            assert put.status_code == 200, put.text
            view = (await http.get("/rollouts/control-order", headers=OPERATOR)).json()
    assert [c["reason"] for c in view["audit"]] == ["all in"]
    # The row and its audit are the control database's; no shard has one.
    rows = await _fetch(pg, "SELECT version, percent FROM saga_rollouts")
    assert [(r["version"], r["percent"]) for r in rows] == [(2, 100)]
    assert await _count(pg, "saga_rollout_audit") == 1
    for shard in pg_shards:
        assert await _count(shard, "saga_rollouts") == 0
    # A new engine reads it from there at its start: new sagas of both shards run v2.
    async with SagaWorker(settings, [OrderV1, OrderV2]), SagaClient(settings) as client:
        ids = _on_each_shard("rolled", 3)
        for saga_id in ids:
            await client.start("control-order", Order(), saga_id=saga_id)
        results = [await client.result(saga_id, timeout=60) for saga_id in ids]
    assert [r["version"] for r in results] == [2] * len(ids)


async def test_a_schedule_with_overlap_skip_waits_for_its_saga_on_a_shard(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...], kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(
        pg,
        pg_shards,
        kafka_bootstrap,
        unique_id,
        schedules=ScheduleSettings(poll_s=0.2),
    )
    schedule = Schedule(id="one-at-a-time", saga="control-waits", every_s=1, overlap=Overlap.SKIP)

    async def progress() -> asyncpg.Record:
        [row] = await _fetch(
            pg,
            "SELECT fired_count, skipped_count, last_saga_id FROM saga_schedules "
            "WHERE schedule_id = $1",
            schedule.id,
        )
        return row

    async with (
        SagaWorker(settings, [Waits], schedules=[schedule]) as worker,
        SagaClient(settings) as client,
    ):
        fired = await eventually(progress, until=lambda r: r["fired_count"] == 1, timeout=30)
        first = fired["last_saga_id"]
        await eventually(lambda: _status(worker, first), until=lambda s: s is SagaStatus.RUNNING)
        # While it runs (on its shard), the next ticks are skipped, not fired.
        skipped = await eventually(progress, until=lambda r: r["skipped_count"] >= 2, timeout=30)
        assert skipped["fired_count"] == 1
        assert skipped["last_saga_id"] == first
        await client.signal(first, Waits.go, Go())
        await client.result(first, timeout=30)
        # Ended: the next tick fires a new saga.
        again = await eventually(progress, until=lambda r: r["fired_count"] >= 2, timeout=30)
        assert again["last_saga_id"] != first
    # The schedule is the control database's; its sagas are the shards'.
    for shard in pg_shards:
        assert await _count(shard, "saga_schedules") == 0
    assert await _count(pg, "sagas") == 0


async def test_a_batch_operation_reaches_the_sagas_of_every_shard(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...], kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(
        pg, pg_shards, kafka_bootstrap, unique_id, batches=BatchSettings(poll_s=0.2, page_size=3)
    )
    ids = _on_each_shard("batched", 4)
    async with SagaWorker(settings, [Waits]) as worker, SagaClient(settings) as client:
        for saga_id in ids:
            await client.start(Waits, Order(), saga_id=saga_id)
        await _all_running(worker, ids)
        operation = await client.start_batch(Waits, "signal", reason="release", signal="go")
        done = await client.wait_batch(operation, timeout=60)
        results = [await client.result(saga_id, timeout=30) for saga_id in ids]
    assert done["state"] == "completed", done
    assert done["acted"] == len(ids), done
    assert results == [{"version": 1}] * len(ids)
    assert await _count(pg_shards[0], "sagas") == 4
    assert await _count(pg_shards[1], "sagas") == 4


async def _orphan(target: PgTarget) -> None:
    orphan = b"a blob whose saga was removed"
    conn = await asyncpg.connect(
        target.database_dsn, server_settings={"search_path": target.schema}
    )
    try:
        await conn.execute(
            "INSERT INTO saga_blobs (digest, data, size) VALUES ($1, $2, $3)",
            hashlib.sha256(orphan).hexdigest(),
            orphan,
            len(orphan),
        )
    finally:
        await conn.close()


def _document(kb: int) -> str:
    return "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(kb * 16))


async def test_blobs_live_in_their_sagas_shard_and_go_only_after_the_saga_is_pruned(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...], kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(
        pg,
        pg_shards,
        kafka_bootstrap,
        unique_id,
        codec=CodecSettings(
            blobs=BlobSettings(
                threshold_bytes=16 * 1024,
                mac_key=SecretStr(MAC),
                grace_s=0,
                sweep_interval_s=0.1,
            )
        ),
        retention=RetentionSettings(days=1e-5, interval_s=0.2, archive="none"),
        engine=EngineSettings(),
    )
    ids = _on_each_shard("document", 1)
    async with SagaWorker(settings, [Waits]) as worker, SagaClient(settings) as client:
        for n, saga_id in enumerate(ids):
            await client.start(Waits, Order(pdf=_document(64 + n)), saga_id=saga_id)
        await _all_running(worker, ids)
        # Each saga's blob is in its own shard, referenced from there; the sweep runs
        # every 0.1 s with no grace and keeps both while their sagas are kept.
        for shard, saga_id in zip(pg_shards, ids, strict=True):
            refs = await _fetch(shard, "SELECT saga_id FROM saga_blob_refs")
            assert [r["saga_id"] for r in refs] == [saga_id]
            assert await _count(shard, "saga_blobs") == 1
        assert await _count(pg, "saga_blobs") == 0
        # An orphan blob in each shard: swept (the sweep runs on both), theirs kept.
        for shard in pg_shards:
            await _orphan(shard)
        for shard in pg_shards:
            await eventually(functools.partial(_count, shard, "saga_blobs"), until=lambda n: n == 1)
        # The second saga ends; pruned, its blob goes. The first's stays.
        await client.signal(ids[1], Waits.go, Go())
        await client.result(ids[1], timeout=30)
        await eventually(lambda: _count(pg_shards[1], "saga_blobs"), until=lambda n: n == 0)
        assert await _count(pg_shards[1], "sagas") == 0
        assert await _count(pg_shards[0], "saga_blobs") == 1
        assert await _status(worker, ids[0]) is SagaStatus.RUNNING


async def test_a_command_and_a_reply_by_reference_keep_their_blobs_in_their_sagas_shard(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...], kafka_bootstrap: str, unique_id: str
) -> None:
    """The engine's command and the participant kit's reply, each over the message size:
    their blobs go to the saga's shard, referenced from there (the kit opens the shards
    as the engine does), and the saga completes."""
    from tests.integration.test_large_payloads import document
    from tests.integration.test_large_records import THRESHOLD, ArchiveDocument, Document, archive

    settings = _settings(
        pg,
        pg_shards,
        kafka_bootstrap,
        unique_id,
        participant=ParticipantSettings(dsn=SecretStr(pg.database_dsn), db_schema=f"{pg.schema}_p"),
        codec=CodecSettings(blobs=BlobSettings(threshold_bytes=THRESHOLD, mac_key=SecretStr(MAC))),
    )
    pdf = document(0.5)  # sent inline by the client; by reference past the threshold
    ids = _on_each_shard("archived", 1)
    handled: list[int] = []
    async with (
        SagaWorker(settings, [ArchiveDocument]),
        archive(settings, handled),
        SagaClient(settings) as client,
    ):
        for saga_id in ids:
            await client.start(ArchiveDocument, Document(pdf=pdf), saga_id=saga_id)
        results = [await client.result(saga_id, timeout=60) for saga_id in ids]
    assert [r["size"] for r in results] == [len(pdf)] * 2
    assert handled == [len(pdf)] * 2
    for shard, saga_id in zip(pg_shards, ids, strict=True):
        refs = await _fetch(shard, "SELECT saga_id, digest FROM saga_blob_refs")
        # The input's, the command's, the reply's (and the stored events' of them): all
        # this saga's, in its shard.
        assert {r["saga_id"] for r in refs} == {saga_id}
        blobs = await _fetch(shard, "SELECT digest FROM saga_blobs")
        assert {r["digest"] for r in blobs} == {r["digest"] for r in refs}
        assert len(blobs) >= 3
    assert await _count(pg, "saga_blobs") == 0

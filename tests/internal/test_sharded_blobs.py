"""Blobs of payloads by reference past one database (``store/_sharded_blobs``), on two
real Postgres clusters: a record's blob is kept in its saga's shard and read from
whichever shard holds it; a read that may lack a shard's blob fails as unavailable, never
as missing; the sweep of a blob store the shards share deletes only what no shard
references, and nothing while a shard does not answer."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest
from pydantic import SecretStr

from saga_engine.kernel._errors import ShardUnavailable
from saga_engine.kernel._settings import PostgresSettings
from saga_engine.kernel._shards import ShardMap
from saga_engine.protocol import partition_for
from saga_engine.store._blobs import BlobStore, DirectoryBlobStore
from saga_engine.store._migrations import migrate
from saga_engine.store._pgstore import PostgresEventStore
from saga_engine.store._sharded import ShardedEventStore
from saga_engine.store._store import EventStore
from tests.conftest import PgTarget

pytestmark = pytest.mark.integration

SHARDS = ShardMap.build({"a": "0-1", "b": "2-3"}, 4)
LATER = datetime.now(UTC) + timedelta(days=1)


def _saga_on(shard: str) -> str:
    return next(f"saga-{n}" for n in range(100) if SHARDS.shard_of_saga(f"saga-{n}") == shard)


def _blob(text: str) -> tuple[str, bytes]:
    data = text.encode()
    return hashlib.sha256(data).hexdigest(), data


async def _sharded(
    shards: tuple[PgTarget, ...], blob_store: BlobStore | None, *, a_down: bool = False
) -> ShardedEventStore:
    async def opener_of(target: PgTarget, dead: bool) -> EventStore:
        dsn = "postgresql://postgres@127.0.0.1:9/none" if dead else target.database_dsn
        settings = PostgresSettings(dsn=SecretStr(dsn), db_schema=target.schema)
        return await PostgresEventStore.connect(settings, blob_store=blob_store)

    for target in shards:
        await migrate(target.database_dsn, target.schema)
    a, b = shards[:2]

    async def open_a() -> EventStore:
        return await opener_of(a, a_down)

    async def open_b() -> EventStore:
        return await opener_of(b, False)

    return ShardedEventStore(SHARDS, {"a": open_a, "b": open_b}, blob_store=blob_store)


async def _digests(target: PgTarget, table: str) -> list[str]:
    conn = await asyncpg.connect(
        target.database_dsn, server_settings={"search_path": target.schema}
    )
    try:
        return [r["digest"] for r in await conn.fetch(f"SELECT digest FROM {table} ORDER BY 1")]
    finally:
        await conn.close()


async def test_a_records_blob_is_kept_in_its_sagas_shard_and_read_from_there(
    pg_shards: tuple[PgTarget, ...],
) -> None:
    assert partition_for(_saga_on("b"), 4) >= 2
    digest, data = _blob("a reply of the saga on shard b")
    store = await _sharded(pg_shards, None)
    try:
        blobs = store.record_blobs()
        await blobs.keep(_saga_on("b"), {digest: data})
        assert await blobs.fetch([digest]) == {digest: data}
    finally:
        await store.close()
    a, b = pg_shards[:2]
    assert await _digests(b, "saga_blobs") == [digest]
    assert await _digests(b, "saga_blob_refs") == [digest]
    assert await _digests(a, "saga_blobs") == []
    assert await _digests(a, "saga_blob_refs") == []
    # Shard a does not answer: b's blob is read; one nobody answered for is unavailable
    # (the record is read again later), not missing (it would be dead-lettered).
    store = await _sharded(pg_shards, None, a_down=True)
    try:
        blobs = store.record_blobs()
        assert await blobs.fetch([digest]) == {digest: data}
        with pytest.raises(ShardUnavailable, match="'a'"):
            await blobs.fetch([_blob("kept on shard a, maybe")[0]])
    finally:
        await store.close()


async def test_the_sweep_of_a_shared_blob_store_asks_every_shard(
    pg_shards: tuple[PgTarget, ...], tmp_path: Path
) -> None:
    shared = DirectoryBlobStore(tmp_path)
    on_a, on_b, orphan = _blob("on a"), _blob("on b"), _blob("no saga")
    store = await _sharded(pg_shards, shared)
    try:
        await store.record_blobs().keep(_saga_on("a"), dict([on_a]))
        await store.record_blobs().keep(_saga_on("b"), dict([on_b]))
        await shared.put(dict([orphan]))
        # Each shard alone would take the other's blob for garbage: asked together,
        # only the orphan goes.
        assert await store.sweep_blobs(timedelta(0), now=LATER) == 1
    finally:
        await store.close()
    assert sorted(await shared.get([on_a[0], on_b[0], orphan[0]])) == sorted([on_a[0], on_b[0]])
    # A shard that does not answer: nothing is swept (its references are unknown).
    await shared.put(dict([orphan]))
    store = await _sharded(pg_shards, shared, a_down=True)
    try:
        with pytest.raises(ShardUnavailable, match="'a'"):
            await store.sweep_blobs(timedelta(0), now=LATER)
    finally:
        await store.close()
    assert len(await shared.get([on_a[0], on_b[0], orphan[0]])) == 3


async def test_each_shard_sweeps_its_own_saga_blobs(pg_shards: tuple[PgTarget, ...]) -> None:
    kept, orphan = _blob("kept"), _blob("orphan")
    store = await _sharded(pg_shards, None)
    try:
        await store.record_blobs().keep(_saga_on("a"), dict([kept]))
        for target in pg_shards[:2]:
            conn = await asyncpg.connect(
                target.database_dsn, server_settings={"search_path": target.schema}
            )
            try:
                await conn.execute(
                    "INSERT INTO saga_blobs (digest, data, size, written_at) "
                    "VALUES ($1, $2, $3, now() - interval '1 hour')",
                    orphan[0],
                    orphan[1],
                    len(orphan[1]),
                )
            finally:
                await conn.close()
        assert await store.sweep_blobs(timedelta(minutes=1), now=LATER) == 2
    finally:
        await store.close()
    assert await _digests(pg_shards[0], "saga_blobs") == [kept[0]]
    assert await _digests(pg_shards[1], "saga_blobs") == []

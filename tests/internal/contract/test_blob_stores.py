"""The BlobStore contract (payloads stored by reference), run against both shipped
stores: Postgres (``saga_blobs``, on the real server) and a directory. A store of a
user's (S3, say) passes the same tests by adding a fixture."""

from __future__ import annotations

import hashlib
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from saga_engine.store._blobs import BlobStore, DirectoryBlobStore
from saga_engine.store._migrations import migrate
from saga_engine.store._pgbase import _init_connection
from saga_engine.store._pgblobs import PostgresBlobStore
from tests.conftest import PgTarget


def blob(n: int) -> tuple[str, bytes]:
    data = f"blob number {n} ".encode() * (n + 1)
    return hashlib.sha256(data).hexdigest(), data


@pytest.fixture(params=["postgres", "directory"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, pg: PgTarget
) -> AsyncIterator[BlobStore]:
    if request.param == "directory":
        yield DirectoryBlobStore(tmp_path / "blobs")
        return
    await migrate(pg.database_dsn, pg.schema)
    pool = await asyncpg.create_pool(
        pg.database_dsn,
        min_size=1,
        max_size=2,
        server_settings={"search_path": pg.schema},
        init=_init_connection,
    )
    try:
        yield PostgresBlobStore(pool)
    finally:
        await pool.close()


async def backdate(store: BlobStore, digest: str, by: timedelta) -> None:
    """Moves a blob's written time back (what waiting ``by`` would do)."""
    if isinstance(store, DirectoryBlobStore):
        path = store.directory / digest[:2] / digest
        when = path.stat().st_mtime - by.total_seconds()
        os.utime(path, (when, when))
        return
    assert isinstance(store, PostgresBlobStore)
    async with store._pool.acquire() as conn:
        await conn.execute(
            "UPDATE saga_blobs SET written_at = written_at - $2::interval WHERE digest = $1",
            digest,
            by,
        )


async def test_what_is_put_is_got_and_a_missing_blob_is_left_out(store: BlobStore) -> None:
    (d1, b1), (d2, b2), (d3, _) = blob(1), blob(2), blob(3)
    await store.put({d1: b1, d2: b2})
    assert await store.get([d1, d2, d3]) == {d1: b1, d2: b2}
    assert await store.get([]) == {}
    assert isinstance(store, BlobStore)
    assert store.name in {"postgres", "directory"}


async def test_put_is_idempotent(store: BlobStore) -> None:
    d1, b1 = blob(1)
    await store.put({d1: b1})
    await store.put({d1: b1})
    assert await store.get([d1]) == {d1: b1}


async def test_written_before_lists_only_old_blobs(store: BlobStore) -> None:
    (d1, b1), (d2, b2) = blob(1), blob(2)
    await store.put({d1: b1, d2: b2})
    await backdate(store, d1, timedelta(hours=2))
    cutoff = datetime.now(UTC) - timedelta(hours=1)
    assert await store.written_before(cutoff) == [d1]


async def test_a_put_again_moves_the_written_time(store: BlobStore) -> None:
    d1, b1 = blob(1)
    await store.put({d1: b1})
    await backdate(store, d1, timedelta(hours=2))
    await store.put({d1: b1})  # referenced again: its grace starts again
    assert await store.written_before(datetime.now(UTC) - timedelta(hours=1)) == []


async def test_delete_deletes_only_what_is_still_old(store: BlobStore) -> None:
    (d1, b1), (d2, b2), (d3, _) = blob(1), blob(2), blob(3)
    await store.put({d1: b1, d2: b2})
    await backdate(store, d1, timedelta(hours=2))
    cutoff = datetime.now(UTC) - timedelta(hours=1)
    # d2 was written since the cutoff, d3 is not there: only d1 goes.
    assert await store.delete([d1, d2, d3], written_before=cutoff) == 1
    assert await store.get([d1, d2]) == {d2: b2}


async def test_a_name_that_is_not_a_content_hash_is_refused(store: BlobStore) -> None:
    with pytest.raises(ValueError, match="content hash"):
        await store.get(["../../etc/passwd"])

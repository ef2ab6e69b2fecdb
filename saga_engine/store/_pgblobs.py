"""Payloads stored by reference on Postgres (migration 0018, docs/large-payloads.md):
the Postgres blob store, what the event store writes with the events (the blobs, when
the store is Postgres, and the references for any store), what its reads fetch, and the
sweeper.

Exact garbage collection: a saga's references are written in the transaction of the
event that makes them, and deleted in the transaction that deletes the saga (retention).
The sweeper deletes a blob only when no reference names it and it was last written more
than the grace period ago; writing a reference writes (or touches) its blob in the same
transaction (Postgres) or just before (a directory), so a blob a transaction is about
to reference is never old enough to go.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

import asyncpg

from saga_engine.core.history._blobref import resolving
from saga_engine.core.history._codec import CodecChain, Undecodable
from saga_engine.store._blobs import BlobStore, check_digest
from saga_engine.store._pgbase import (
    EventRow,
    _Conn,
    _stored_events,
    _unavailable_as_transient,
)
from saga_engine.store._store import StoredEvent

__all__ = [
    "PostgresBlobStore",
    "PostgresRecordBlobs",
    "blobs_of",
    "drop_references",
    "stored_events_of",
    "sweep_blobs",
    "write_blobs",
]

_PUT: Final = (
    "INSERT INTO saga_blobs (digest, data, size) "
    "SELECT d, b, length(b) FROM unnest($1::text[], $2::bytea[]) AS t(d, b) "
    "ON CONFLICT (digest) DO UPDATE SET written_at = now()"
)
_REFS: Final = (
    "INSERT INTO saga_blob_refs (saga_id, digest) "
    "SELECT * FROM unnest($1::text[], $2::text[]) ON CONFLICT DO NOTHING"
)


class PostgresBlobStore:
    """The ``saga_blobs`` table as a BlobStore (the event store writes it in its own
    transactions; this is the port over a pool, for the sweeper and the contract)."""

    name = "postgres"

    def __init__(self, pool: asyncpg.Pool[asyncpg.Record]) -> None:
        self._pool = pool

    async def put(self, blobs: Mapping[str, bytes]) -> None:
        if not blobs:
            return
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn:
                await _put(conn, blobs)

    async def get(self, digests: Collection[str]) -> dict[str, bytes]:
        with _unavailable_as_transient():
            rows = await self._pool.fetch(
                "SELECT digest, data FROM saga_blobs WHERE digest = ANY($1::text[])",
                [check_digest(d) for d in digests],
            )
        return {r["digest"]: r["data"] for r in rows}

    async def written_before(self, cutoff: datetime) -> list[str]:
        with _unavailable_as_transient():
            rows = await self._pool.fetch(
                "SELECT digest FROM saga_blobs WHERE written_at < $1", cutoff
            )
        return [r["digest"] for r in rows]

    async def delete(self, digests: Collection[str], *, written_before: datetime) -> int:
        with _unavailable_as_transient():
            done = await self._pool.fetch(
                "DELETE FROM saga_blobs WHERE digest = ANY($1::text[]) AND written_at < $2 "
                "RETURNING digest",
                list(digests),
                written_before,
            )
        return len(done)


class PostgresRecordBlobs:
    """The blobs of Kafka records by reference (``transport/_record_blobs.RecordBlobs``)
    on the engine's database: ``keep`` writes the blobs (to ``saga_blobs`` when ``store``
    is None, in the transaction of their references; else to ``store`` first) and a
    reference to each from the record's saga, so the sweeper keeps them as long as the
    saga is kept; ``fetch`` reads them back. The engine uses one for its commands and
    their replies; a participant kit one on the engine's database for both."""

    def __init__(self, pool: asyncpg.Pool[asyncpg.Record], store: BlobStore | None = None) -> None:
        self._pool = pool
        self._store = store

    async def keep(self, saga_id: str, blobs: Mapping[str, bytes]) -> None:
        if not blobs:
            return
        if self._store is not None:
            await self._store.put(blobs)
        references = [(saga_id, digest) for digest in blobs]
        own = dict(blobs) if self._store is None else None
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn, conn.transaction():
                await write_blobs(conn, references, own)

    async def fetch(self, digests: Collection[str]) -> dict[str, bytes]:
        if self._store is not None:
            return await self._store.get(digests)
        return await PostgresBlobStore(self._pool).get(digests)

    async def referenced(self, digests: Collection[str]) -> set[str]:
        """Those of ``digests`` some saga of this database references (the sweep of a
        blob store several databases share asks each: ``_sharded_blobs``)."""
        with _unavailable_as_transient():
            return await _referenced(self._pool, digests)


async def _put(conn: _Conn, blobs: Mapping[str, bytes]) -> None:
    # Content hash order: two transactions touching the same blobs lock them in one order.
    ordered = sorted(check_digest(d) for d in blobs)
    await conn.execute(_PUT, ordered, [blobs[d] for d in ordered])


async def _referenced(
    conn: _Conn | asyncpg.Pool[asyncpg.Record], digests: Collection[str]
) -> set[str]:
    rows = await conn.fetch(
        "SELECT DISTINCT digest FROM saga_blob_refs WHERE digest = ANY($1::text[])", list(digests)
    )
    return {r["digest"] for r in rows}


async def write_blobs(
    conn: _Conn, references: Collection[tuple[str, str]], blobs: Mapping[str, bytes] | None
) -> None:
    """In the events' transaction: the (saga id, content hash) references, and the blobs
    themselves when they live in ``saga_blobs`` (``blobs``; None: another store holds
    them, written before the transaction)."""
    if blobs:
        await _put(conn, blobs)
    if references:
        await conn.execute(_REFS, [s for s, _ in references], [d for _, d in references])


async def blobs_of(
    conn: _Conn, saga_ids: Collection[str], store: BlobStore | None
) -> dict[str, bytes]:
    """The blobs the sagas ``saga_ids`` reference, by content hash: from ``saga_blobs``
    in the same query (``store`` None), else fetched from ``store``. A missing one is
    left out (decoding its reference then raises ``blob_missing``)."""
    ids = list(saga_ids)
    if store is None:
        rows = await conn.fetch(
            "SELECT b.digest, b.data FROM saga_blob_refs r JOIN saga_blobs b "
            "ON b.digest = r.digest WHERE r.saga_id = ANY($1::text[])",
            ids,
        )
        return {r["digest"]: r["data"] for r in rows}
    rows = await conn.fetch(
        "SELECT DISTINCT digest FROM saga_blob_refs WHERE saga_id = ANY($1::text[])", ids
    )
    return await store.get([r["digest"] for r in rows]) if rows else {}


async def stored_events_of(
    conn: _Conn,
    rows: Sequence[EventRow],
    saga_ids: Collection[str],
    codec: CodecChain | None,
    store: BlobStore | None,
    undecodable: Undecodable = Undecodable.RAISE,
) -> list[StoredEvent]:
    """``_stored_events`` with the references of ``saga_ids``' payloads resolved: their
    blobs fetched first, when the chain stores payloads by reference."""
    if codec is None or codec.reference is None or not rows:
        return _stored_events(rows, codec, undecodable)
    blobs = await blobs_of(conn, saga_ids, store)
    with resolving(blobs):
        return _stored_events(rows, codec, undecodable)


async def drop_references(conn: _Conn, saga_ids: Collection[str]) -> None:
    """In the transaction deleting the sagas ``saga_ids``: their references."""
    await conn.execute("DELETE FROM saga_blob_refs WHERE saga_id = ANY($1::text[])", list(saga_ids))


async def sweep_blobs(
    pool: asyncpg.Pool[asyncpg.Record],
    store: BlobStore | None,
    grace: timedelta,
    *,
    now: datetime | None = None,
) -> int:
    """Deletes the blobs no saga references that were last written before ``now`` less
    ``grace``; returns how many. ``store`` None: ``saga_blobs``, in one statement."""
    cutoff = (now or datetime.now(UTC)) - grace
    with _unavailable_as_transient():
        if store is None:
            done = await pool.fetch(
                "DELETE FROM saga_blobs b WHERE b.written_at < $1 AND NOT EXISTS "
                "(SELECT 1 FROM saga_blob_refs r WHERE r.digest = b.digest) RETURNING digest",
                cutoff,
            )
            return len(done)
        old = await store.written_before(cutoff)
        if not old:
            return 0
        referenced = await _referenced(pool, old)
    return await store.delete([d for d in old if d not in referenced], written_before=cutoff)

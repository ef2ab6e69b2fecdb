"""The Postgres store's part in retention: which finished sagas are old enough, their
histories, and their removal (with the archive row, migration 0005) in one transaction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Final

import asyncpg

from saga_engine.core.history._codec import CodecChain
from saga_engine.core.history._status import SagaStatus
from saga_engine.store._blobs import BlobStore
from saga_engine.store._pgbase import (
    _RECORD_COLUMNS,
    _record,
    _unavailable_as_transient,
    first_event_sql,
    unnest_rows,
)
from saga_engine.store._pgblobs import drop_references, stored_events_of
from saga_engine.store._store import ArchivedSaga, LoadedSaga, StoredEvent

_TERMINAL: Final = [s.value for s in SagaStatus if s.is_terminal]
#: The saga that started saga ``s`` (its first event names it, outside any codec).
_PARENT: Final = first_event_sql("-> 'parent' ->> 'saga_id'")


class PostgresRetention:
    """Mixed into PostgresEventStore: retention's queries, over its pool."""

    _pool: asyncpg.Pool[asyncpg.Record]
    _codec: CodecChain | None
    _blob_store: BlobStore | None

    async def finished_before(
        self,
        cutoff: datetime,
        *,
        saga_types: Collection[str] | None = None,
        other_than: Collection[str] = (),
        partitions: Collection[int] | None = None,
        partition_count: int = 0,
        limit: int = 500,
    ) -> list[str]:
        clauses = ["status = ANY($1::text[])", "ended_at < $2"]
        args: list[object] = [_TERMINAL, cutoff]

        def arg(value: object) -> str:
            args.append(value)
            return f"${len(args)}"

        if saga_types is not None:
            clauses.append(f"saga_type = ANY({arg(sorted(saga_types))}::text[])")
        if other_than:
            clauses.append(f"saga_type <> ALL({arg(sorted(other_than))}::text[])")
        if partitions is not None:
            wanted = sorted(set(partitions))
            # Sagas from before migration 0004 have no hash: partition 0's owner takes them.
            unhashed = " OR key_hash IS NULL" if 0 in wanted else ""
            clauses.append(
                f"(key_hash % {arg(partition_count)} = ANY({arg(wanted)}::int[]){unhashed})"
            )
        # A child saga stays while its parent's row does: the parent may still compensate
        # and undo it (an undo that found no child would answer "nothing to undo"), or
        # re-send its start. Its parent is named in its first event, outside any codec.
        clauses.append(f"NOT EXISTS (SELECT 1 FROM sagas p WHERE p.saga_id = {_PARENT})")
        # The ended_at index, oldest first: a bounded batch per call.
        sql = (
            f"SELECT saga_id FROM sagas s WHERE {' AND '.join(clauses)} "
            f"ORDER BY ended_at, saga_id LIMIT {arg(limit)}"
        )
        with _unavailable_as_transient():
            rows = await self._pool.fetch(sql, *args)
        return [r["saga_id"] for r in rows]

    async def histories(self, saga_ids: Collection[str]) -> list[LoadedSaga]:
        ids = sorted(set(saga_ids))
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn:
                records = await conn.fetch(
                    f"SELECT {_RECORD_COLUMNS} FROM sagas WHERE saga_id = ANY($1::text[]) "
                    "ORDER BY saga_id",
                    ids,
                )
                rows = await conn.fetch(
                    "SELECT saga_id, seq, events FROM saga_decisions "
                    "WHERE saga_id = ANY($1::text[]) ORDER BY saga_id, seq",
                    ids,
                )
                owners = [r["saga_id"] for r in rows for _ in r["events"]]
                # Archived histories hold the payloads, not references to them: the
                # blobs go once the saga's references are dropped with it.
                stored = await stored_events_of(
                    conn, unnest_rows(rows), ids, self._codec, self._blob_store
                )
        by_saga: defaultdict[str, list[StoredEvent]] = defaultdict(list)
        for owner, stored_event in zip(owners, stored, strict=True):
            by_saga[owner].append(stored_event)
        out = []
        for row in records:
            record = _record(row, self._codec)
            history = [e for e in by_saga[record.saga_id] if e.seq <= record.last_seq]
            out.append(LoadedSaga(record, history))
        return out

    async def remove_finished(
        self, saga_ids: Collection[str], archive: Sequence[ArchivedSaga] = ()
    ) -> int:
        ids = sorted(set(saga_ids))
        if not ids:
            return 0
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn, conn.transaction():
                if archive:
                    # ON CONFLICT DO NOTHING: a batch archived before, whose delete did not
                    # commit (the process died), is archived again; the first copy stays
                    # (the same saga: same id and creation time, same history).
                    await conn.execute(
                        "INSERT INTO saga_archive (saga_id, saga_type, status, created_at, "
                        "finished_at, history) SELECT * FROM unnest($1::text[], $2::text[], "
                        "$3::text[], $4::timestamptz[], $5::timestamptz[], $6::bytea[]) "
                        "ON CONFLICT (saga_id, created_at) DO NOTHING",
                        [a.record.saga_id for a in archive],
                        [a.record.saga_type for a in archive],
                        [a.record.status.value for a in archive],
                        [a.record.created_at for a in archive],
                        [a.record.updated_at for a in archive],
                        [a.history for a in archive],
                    )
                # Only finished sagas, whatever the caller passed; the row lock taken by
                # DELETE waits for an engine writing the same saga, and a saga an operator
                # just resumed (open again) is not deleted.
                deleted = await conn.fetch(
                    "DELETE FROM sagas WHERE saga_id = ANY($1::text[]) "
                    "AND status = ANY($2::text[]) RETURNING saga_id",
                    ids,
                    _TERMINAL,
                )
                gone = [r["saga_id"] for r in deleted]
                if gone:
                    await conn.execute(
                        "DELETE FROM saga_decisions WHERE saga_id = ANY($1::text[])", gone
                    )
                    await drop_references(conn, gone)
        return len(gone)

    async def archived_history(self, saga_id: str) -> bytes | None:
        with _unavailable_as_transient():
            # The latest of that id (an id may be reused once its saga was deleted).
            value = await self._pool.fetchval(
                "SELECT history FROM saga_archive WHERE saga_id = $1 "
                "ORDER BY created_at DESC LIMIT 1",
                saga_id,
            )
        return bytes(value) if value is not None else None

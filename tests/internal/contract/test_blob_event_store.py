"""The Postgres event store with payloads stored by reference, on the real server: the
blob and the event that references it commit together (a failed transaction leaves
neither), readers resolve references, a missing or altered blob is a clear CodecError
(never a payload), retention drops a saga's references and the sweeper its blobs."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import asyncpg
import pytest
from pydantic import SecretStr

from saga_engine.core.history._blobref import ReferenceCodec
from saga_engine.core.history._codec import ENCRYPTED, CodecChain, Undecodable, ZstdCodec
from saga_engine.core.history._events import Event, ReplyReceived, SagaCompleted, SagaStarted
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import CodecError, CodecFailure
from saga_engine.settings import PostgresSettings
from saga_engine.store._blobs import BlobStore, DirectoryBlobStore
from saga_engine.store._migrations import migrate
from saga_engine.store._pgblobs import write_blobs
from saga_engine.store._pgstore import GroupCommitConfig, PostgresEventStore
from saga_engine.store._store import Append, NewSaga, Projection
from tests.conftest import PgTarget
from tests.waiting import eventually

MAC = b"k" * 32
THRESHOLD = 4096

Opener = Callable[..., Awaitable[PostgresEventStore]]


def chain() -> CodecChain:
    return CodecChain(ZstdCodec(threshold=1024), ReferenceCodec(THRESHOLD, MAC, "postgres"))


def document(seed: str, kib: int = 300) -> str:
    """Text that does not compress below the threshold (hex of hashes)."""
    return "".join(hashlib.sha256(f"{seed}{i}".encode()).hexdigest() for i in range(kib * 16))


@pytest.fixture
async def opener(pg: PgTarget) -> AsyncIterator[Opener]:
    await migrate(pg.database_dsn, pg.schema)
    opened: list[PostgresEventStore] = []

    async def open_store(
        blob_store: BlobStore | None = None, group_commit: GroupCommitConfig | None = None
    ) -> PostgresEventStore:
        store = await PostgresEventStore.connect(
            PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema),
            codec=chain(),
            blob_store=blob_store,
            group_commit=group_commit,
        )
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        await store.close()


async def fetch(pg: PgTarget, query: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(pg.dsn)
    try:
        return await conn.fetch(query)
    finally:
        await conn.close()


async def execute(pg: PgTarget, statement: str) -> None:
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def started(doc: str) -> SagaStarted:
    return SagaStarted(at=datetime.now(UTC), saga_type="invoice", input={"pdf": doc})


async def create(store: PostgresEventStore, saga_id: str, *events: Event) -> None:
    assert await store.create(
        NewSaga(saga_id, "invoice", list(events), Projection(SagaStatus.RUNNING))
    )


async def test_a_large_payload_is_stored_by_reference_and_read_back(
    pg: PgTarget, opener: Opener
) -> None:
    store = await opener()
    doc, result = document("in"), document("out")
    first = started(doc)
    await create(store, "s-1", first)
    reply = ReplyReceived(
        at=datetime.now(UTC),
        step="render",
        command_id="c",
        outcome="success",
        payload={"r": result},
    )
    await store.append(Append("s-1", 1, [reply], Projection(SagaStatus.RUNNING)))
    [row] = await fetch(pg, "SELECT max(length(data::text)) AS n FROM saga_events")
    assert row["n"] < 2000  # the events hold references, not the documents
    blobs = await fetch(pg, "SELECT digest, size FROM saga_blobs")
    refs = await fetch(pg, "SELECT saga_id, digest FROM saga_blob_refs")
    assert len(blobs) == 2
    assert {(r["saga_id"], r["digest"]) for r in refs} == {("s-1", b["digest"]) for b in blobs}
    loaded = await store.load("s-1")
    assert [e.event for e in loaded.events] == [first, reply]
    assert (await store.first_event("s-1")).event.input == {"pdf": doc}  # type: ignore[union-attr]
    [history] = await store.histories(["s-1"])
    assert history.events[1].event == reply


async def test_a_small_payload_makes_no_blob(pg: PgTarget, opener: Opener) -> None:
    store = await opener()
    await create(store, "s-small", started("tiny"))
    assert await fetch(pg, "SELECT * FROM saga_blobs") == []
    assert (await store.load("s-small")).events[0].event.input == {"pdf": "tiny"}  # type: ignore[union-attr]


@pytest.mark.parametrize("batched", [True, False])
async def test_a_failed_transaction_leaves_neither_the_event_nor_the_blob(
    pg: PgTarget, opener: Opener, batched: bool
) -> None:
    # The references are the transaction's last statement: make it fail there, after the
    # blob and the event were inserted, as a crash before COMMIT would.
    await execute(
        pg,
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'crash before commit'; END $$; "
        "CREATE TRIGGER refuse BEFORE INSERT ON saga_blob_refs FOR EACH ROW "
        "WHEN (NEW.saga_id = 'doomed') EXECUTE FUNCTION refuse()",
    )
    store = await opener(group_commit=GroupCommitConfig(enabled=batched))
    with pytest.raises(Exception, match="crash before commit"):
        await create(store, "doomed", started(document("doomed")))
    assert await fetch(pg, "SELECT * FROM saga_blobs") == []
    assert await fetch(pg, "SELECT * FROM saga_events") == []
    assert await fetch(pg, "SELECT * FROM sagas") == []
    # Another saga's write is not held back by it.
    await create(store, "fine", started(document("fine")))
    assert len(await fetch(pg, "SELECT * FROM saga_blobs")) == 1


async def test_a_missing_blob_is_an_error_never_a_payload(pg: PgTarget, opener: Opener) -> None:
    store = await opener()
    await create(store, "s-2", started(document("gone")))
    await execute(pg, "DELETE FROM saga_blobs")
    with pytest.raises(CodecError) as caught:
        await store.load("s-2")
    assert caught.value.failure is CodecFailure.BLOB_MISSING
    shown = (await store.load("s-2", undecodable=Undecodable.SHOW)).events[0].event
    assert shown.input[ENCRYPTED]["failure"] == "blob_missing"  # type: ignore[union-attr]


async def test_an_altered_blob_is_tampered(pg: PgTarget, opener: Opener) -> None:
    store = await opener()
    await create(store, "s-3", started(document("altered")))
    await execute(
        pg, "UPDATE saga_blobs SET data = set_byte(data, 100, (get_byte(data, 100) + 1) % 256)"
    )
    with pytest.raises(CodecError) as caught:
        await store.load("s-3")
    assert caught.value.failure is CodecFailure.BLOB_TAMPERED


async def test_a_directory_store_holds_the_blob_and_postgres_the_reference(
    pg: PgTarget, opener: Opener, tmp_path: Path
) -> None:
    directory = DirectoryBlobStore(tmp_path)
    store = await opener(directory)
    doc = document("dir")
    await create(store, "s-4", started(doc))
    assert await fetch(pg, "SELECT * FROM saga_blobs") == []
    [ref] = await fetch(pg, "SELECT digest FROM saga_blob_refs")
    assert (tmp_path / ref["digest"][:2] / ref["digest"]).is_file()
    assert (await store.load("s-4")).events[0].event.input == {"pdf": doc}  # type: ignore[union-attr]
    (tmp_path / ref["digest"][:2] / ref["digest"]).unlink()
    with pytest.raises(CodecError) as caught:
        await store.load("s-4")
    assert caught.value.failure is CodecFailure.BLOB_MISSING


@pytest.mark.parametrize("on_directory", [False, True])
async def test_retention_drops_references_and_the_sweeper_the_blobs(
    pg: PgTarget, opener: Opener, tmp_path: Path, on_directory: bool
) -> None:
    directory = DirectoryBlobStore(tmp_path) if on_directory else None
    store = await opener(directory)
    shared, own = document("shared"), document("own")
    await create(store, "ended", started(shared))
    await store.append(
        Append(
            "ended",
            1,
            [SagaCompleted(at=datetime.now(UTC), output={"o": own})],
            Projection(SagaStatus.COMPLETED),
        )
    )
    await create(store, "open", started(shared))  # the same document: one blob, two refs
    later = datetime.now(UTC) + timedelta(hours=2)
    assert await store.sweep_blobs(timedelta(hours=1), now=later) == 0  # all referenced
    assert await store.remove_finished(["ended"]) == 1
    assert {r["saga_id"] for r in await fetch(pg, "SELECT saga_id FROM saga_blob_refs")} == {"open"}
    # Within the grace period nothing goes; after it, the blob only "ended" referenced.
    assert await store.sweep_blobs(timedelta(hours=1)) == 0
    assert await store.sweep_blobs(timedelta(hours=1), now=later) == 1
    assert (await store.load("open")).events[0].event.input == {"pdf": shared}  # type: ignore[union-attr]


async def test_a_sweep_racing_a_write_that_references_an_old_blob_keeps_it(
    pg: PgTarget, opener: Opener
) -> None:
    # The blob of a removed saga, past its grace: the sweeper's to delete...
    store = await opener()
    doc = document("again")
    await create(store, "old", started(doc))
    await execute(pg, "UPDATE sagas SET status = 'completed'")
    assert await store.remove_finished(["old"]) == 1
    await execute(pg, "UPDATE saga_blobs SET written_at = written_at - interval '2 hours'")
    [row] = await fetch(pg, "SELECT digest, data FROM saga_blobs")
    # ...until a saga's write references it again, in a transaction not yet committed.
    writer = await asyncpg.connect(pg.dsn)
    try:
        tx = writer.transaction()
        await tx.start()
        await write_blobs(cast(Any, writer), [("new", row["digest"])], {row["digest"]: row["data"]})
        sweep = asyncio.create_task(store.sweep_blobs(timedelta(hours=1)))

        async def sweep_waits_for_the_writer() -> bool:
            rows = await fetch(
                pg,
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'DELETE FROM saga_blobs%'",
            )
            return bool(rows) or sweep.done()

        await eventually(sweep_waits_for_the_writer)
        assert not sweep.done(), "the sweep deleted a blob a transaction was referencing"
        await tx.commit()
        assert await sweep == 0
    finally:
        await writer.close()
    assert len(await fetch(pg, "SELECT * FROM saga_blobs")) == 1

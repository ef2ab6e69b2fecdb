"""Blob garbage collection is exact (payloads stored by reference): under generated
sequences of sagas written with large documents (shared between sagas or not), sagas
ended and removed by retention, time passing and sweeps, some racing a write that
references an old, unreferenced blob again, on the real Postgres with either store:

- no blob a saga references is ever deleted: every saga still in the store loads, its
  documents intact (a missing blob would raise ``blob_missing``);
- once the grace period has passed, a sweep leaves no blob that no saga references.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from saga_engine.core.history._blobref import ReferenceCodec
from saga_engine.core.history._codec import CodecChain
from saga_engine.core.history._events import SagaCompleted, SagaStarted
from saga_engine.core.history._status import SagaStatus
from saga_engine.settings import PostgresSettings
from saga_engine.store._blobs import DirectoryBlobStore
from saga_engine.store._migrations import migrate
from saga_engine.store._pgstore import PostgresEventStore
from saga_engine.store._store import Append, NewSaga, Projection
from tests.conftest import PgTarget

GRACE = timedelta(hours=1)
DOCS = [
    "".join(hashlib.sha256(f"{n}-{i}".encode()).hexdigest() for i in range(100)) for n in range(4)
]


@dataclass(frozen=True)
class Write:
    """A new saga whose input holds document ``doc`` (by reference)."""

    doc: int


@dataclass(frozen=True)
class End:
    """The ``saga``-th saga written ends, its output holding document ``doc``."""

    saga: int
    doc: int


@dataclass(frozen=True)
class Retire:
    """Retention removes the ``saga``-th saga written (if it ended)."""

    saga: int


@dataclass(frozen=True)
class Age:
    """Every blob is now older than the grace period."""


@dataclass(frozen=True)
class Sweep:
    """A sweep; ``racing``: at the same time as a write referencing document ``doc``."""

    racing: bool
    doc: int


docs = st.integers(0, len(DOCS) - 1)
ops = st.lists(
    st.one_of(
        st.builds(Write, docs),
        st.builds(End, st.integers(0, 7), docs),
        st.builds(Retire, st.integers(0, 7)),
        st.just(Age()),
        st.builds(Sweep, st.booleans(), docs),
    ),
    max_size=14,
)


class World:
    def __init__(self, store: PostgresEventStore, pg: PgTarget, directory: Path | None) -> None:
        self.store, self.pg, self.directory = store, pg, directory
        self.sagas: list[str] = []
        self.docs: dict[str, set[int]] = {}
        self.ended: set[str] = set()

    async def write(self, doc: int) -> None:
        saga_id = f"s{len(self.sagas)}"
        self.sagas.append(saga_id)
        started = SagaStarted(at=datetime.now(UTC), saga_type="t", input={"d": DOCS[doc]})
        await self.store.create(NewSaga(saga_id, "t", [started], Projection(SagaStatus.RUNNING)))
        self.docs[saga_id] = {doc}

    async def apply(self, op: object) -> None:
        if isinstance(op, Write):
            await self.write(op.doc)
        elif isinstance(op, End) and op.saga < len(self.sagas):
            saga_id = self.sagas[op.saga]
            if saga_id in self.docs and saga_id not in self.ended:
                done = SagaCompleted(at=datetime.now(UTC), output={"d": DOCS[op.doc]})
                await self.store.append(
                    Append(saga_id, 1, [done], Projection(SagaStatus.COMPLETED))
                )
                self.ended.add(saga_id)
                self.docs[saga_id].add(op.doc)
        elif isinstance(op, Retire) and op.saga < len(self.sagas):
            saga_id = self.sagas[op.saga]
            if await self.store.remove_finished([saga_id]):
                del self.docs[saga_id]
        elif isinstance(op, Age):
            await self.age()
        elif isinstance(op, Sweep):
            sweep = self.store.sweep_blobs(GRACE)
            if op.racing:
                await asyncio.gather(sweep, self.write(op.doc))
            else:
                await sweep

    async def age(self) -> None:
        if self.directory is not None:
            old = (datetime.now(UTC) - 2 * GRACE).timestamp()
            for path in self.directory.rglob("*"):
                if path.is_file():
                    os.utime(path, (old, old))
            return
        conn = await asyncpg.connect(self.pg.dsn)
        try:
            await conn.execute(
                "UPDATE saga_blobs SET written_at = written_at - $1::interval", 2 * GRACE
            )
        finally:
            await conn.close()

    async def check(self) -> None:
        # Every saga still stored loads (its blobs all there), its documents intact.
        for saga_id, doc_ids in self.docs.items():
            loaded = await self.store.load(saga_id)
            found = {
                DOCS.index(e.event.input["d"])
                for e in loaded.events
                if isinstance(e.event, SagaStarted)
            }
            found |= {
                DOCS.index(e.event.output["d"])
                for e in loaded.events
                if isinstance(e.event, SagaCompleted)
            }
            assert found == doc_ids

    async def stored(self) -> set[str]:
        if self.directory is not None:
            return {p.name for p in self.directory.rglob("*") if p.is_file()}
        conn = await asyncpg.connect(self.pg.dsn)
        try:
            return {r["digest"] for r in await conn.fetch("SELECT digest FROM saga_blobs")}
        finally:
            await conn.close()


async def _run(pg: PgTarget, steps: list[object], on_directory: bool) -> None:
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute("TRUNCATE sagas, saga_decisions, saga_blobs, saga_blob_refs")
    finally:
        await conn.close()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) if on_directory else None
        store = await PostgresEventStore.connect(
            PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema),
            codec=CodecChain(ReferenceCodec(1024, b"m" * 32, "postgres")),
            blob_store=DirectoryBlobStore(directory) if directory else None,
        )
        try:
            world = World(store, pg, directory)
            for step in steps:
                await world.apply(step)
                await world.check()
            # Exact: once every blob is past its grace, a sweep leaves only referenced ones.
            await world.age()
            await store.sweep_blobs(GRACE)
            referenced = {
                hashlib.sha256(f'{{"d":"{DOCS[d]}"}}'.encode()).hexdigest()
                for ds in world.docs.values()
                for d in ds
            }
            assert await world.stored() == referenced
            await world.check()
        finally:
            await store.close()


def test_no_referenced_blob_is_ever_deleted_and_no_other_outlives_a_sweep(pg: PgTarget) -> None:
    asyncio.run(migrate(pg.database_dsn, pg.schema))

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(steps=ops, on_directory=st.booleans())
    def run(steps: list[object], on_directory: bool) -> None:
        asyncio.run(_run(pg, steps, on_directory))

    run()

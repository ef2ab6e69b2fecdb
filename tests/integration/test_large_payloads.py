"""Payloads stored by reference (docs/large-payloads.md) on the real servers: a saga
started with a document above the message size limit runs, its history holding a
reference; with the blob gone, a signal for it is dead-lettered ``blob_missing`` and
the saga is not driven; with payloads by reference off, the same start is refused with
an error that says how to turn it on."""

from __future__ import annotations

import base64
import hashlib
import uuid

import asyncpg
import pytest
from pydantic import BaseModel, SecretStr

from saga_engine import PayloadTooLarge, Saga, SagaContext, SagaStatus, Settings, Signal
from saga_engine.events import SagaStarted
from saga_engine.protocol import Envelope, MessageType, Topics
from saga_engine.settings import (
    AdminSettings,
    BlobSettings,
    CodecSettings,
    KafkaSettings,
    ParticipantSettings,
    PostgresSettings,
)
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.edge.conftest import dead_letters, produce
from tests.served_worker import READER_TOKEN, real_settings, served_worker
from tests.waiting import eventually

pytestmark = pytest.mark.integration

MAC = base64.b64encode(b"a MAC key of 32 bytes, for tests").decode()


class Document(BaseModel):
    pdf: str


class Filed(BaseModel):
    size: int
    sha256: str


class Approval(BaseModel):
    pass


class FileInvoice(Saga[Document, Filed]):
    name = "file-invoice"
    approve = Signal(Approval)

    async def run(self, ctx: SagaContext, input: Document) -> Filed:
        await ctx.wait_signal(self.approve)
        digest = hashlib.sha256(input.pdf.encode()).hexdigest()
        return Filed(size=len(input.pdf), sha256=digest)


def settings_for(
    pg: PgTarget, bootstrap: str, *, by_reference: bool, sweep_interval_s: float = 600
) -> Settings:
    tag = uuid.uuid4().hex[:10]
    blobs = BlobSettings(
        threshold_bytes=64 * 1024,
        mac_key=SecretStr(MAC),
        grace_s=0,
        sweep_interval_s=sweep_interval_s,
    )
    return Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=bootstrap, topic_prefix=f"blobs{tag}", group_id=f"blobs-{tag}"
        ),
        participant=ParticipantSettings(dsn=SecretStr(pg.database_dsn), db_schema=f"{pg.schema}_p"),
        admin=AdminSettings(enabled=False, port=0),
        codec=CodecSettings(blobs=blobs) if by_reference else CodecSettings(),
    )


def document(mb: float) -> str:
    hashes = int(mb * 1024 * 1024 / 64)
    return "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(hashes))


def approve(saga_id: str) -> Envelope:
    return Envelope(
        message_type=MessageType.SIGNAL,
        source="/approver",
        saga_id=saga_id,
        subject="approve",
        body={"name": "approve", "signal_id": str(uuid.uuid4()), "payload": {}},
    )


async def test_a_document_over_the_message_size_runs_by_reference(
    pg: PgTarget, kafka_bootstrap: str
) -> None:
    settings = settings_for(pg, kafka_bootstrap, by_reference=True)
    pdf = document(2.5)  # over kafka.max_message_bytes (1 MB)
    assert len(pdf) > settings.kafka.max_message_bytes
    async with SagaWorker(settings, [FileInvoice]) as worker:
        engine = worker.engine
        assert engine is not None
        saga_id = await engine.start(FileInvoice, Document(pdf=pdf))
        await eventually(lambda: _status(worker, saga_id, SagaStatus.RUNNING))
        conn = await asyncpg.connect(pg.dsn)
        try:
            longest = await conn.fetchval("SELECT max(length(data::text)) FROM saga_events")
            stored = await conn.fetchval("SELECT sum(size) FROM saga_blobs")
        finally:
            await conn.close()
        assert longest < 10_000  # a reference in the event
        assert len(pdf) < stored < len(pdf) + 100  # the input as JSON, by reference
        engine.evict(saga_id)  # the signal rebuilds the saga from the store
        await produce(settings, Topics.of(settings.kafka).inbox, approve(saga_id))
        record = await engine.wait(saga_id, timeout=30)
        assert record.status is SagaStatus.COMPLETED
        first = (await engine.history(saga_id))[0]
        assert isinstance(first, SagaStarted)
        assert first.input == {"pdf": pdf}


async def test_a_missing_blob_dead_letters_the_record_and_the_saga_is_not_driven(
    pg: PgTarget, kafka_bootstrap: str
) -> None:
    settings = settings_for(pg, kafka_bootstrap, by_reference=True)
    async with SagaWorker(settings, [FileInvoice]) as worker:
        engine = worker.engine
        assert engine is not None
        saga_id = await engine.start(FileInvoice, Document(pdf=document(0.5)))
        await eventually(lambda: _status(worker, saga_id, SagaStatus.RUNNING))
        before = await engine.get(saga_id)
        conn = await asyncpg.connect(pg.dsn)
        try:
            digest = await conn.fetchval("DELETE FROM saga_blobs RETURNING digest")
        finally:
            await conn.close()
        engine.evict(saga_id)
        await produce(settings, Topics.of(settings.kafka).inbox, approve(saga_id))
        [letter] = await dead_letters(settings, 1)
        assert letter["dlq_reason"] == "blob_missing"
        assert digest in letter["dlq_detail"]
        after = await engine.get(saga_id)
        assert (after.status, after.last_seq) == (SagaStatus.RUNNING, before.last_seq)


async def test_without_payloads_by_reference_a_large_input_is_refused_with_the_way_out(
    pg: PgTarget, kafka_bootstrap: str
) -> None:
    settings = settings_for(pg, kafka_bootstrap, by_reference=False)
    async with SagaWorker(settings, [FileInvoice]) as worker:
        engine = worker.engine
        assert engine is not None
        with pytest.raises(PayloadTooLarge, match="SAGA_CODEC__BLOBS__THRESHOLD_BYTES"):
            await engine.start(FileInvoice, Document(pdf=document(1.5)))


async def test_the_worker_sweeps_unreferenced_blobs_and_keeps_the_others(
    pg: PgTarget, kafka_bootstrap: str
) -> None:
    settings = settings_for(pg, kafka_bootstrap, by_reference=True, sweep_interval_s=0.05)
    async with SagaWorker(settings, [FileInvoice]) as worker:
        engine = worker.engine
        assert engine is not None
        saga_id = await engine.start(FileInvoice, Document(pdf=document(0.5)))
        conn = await asyncpg.connect(pg.dsn)
        try:
            orphan = b"a blob whose saga was removed"
            await conn.execute(
                "INSERT INTO saga_blobs (digest, data, size) VALUES ($1, $2, $3)",
                hashlib.sha256(orphan).hexdigest(),
                orphan,
                len(orphan),
            )

            async def blobs() -> int:
                return int(await conn.fetchval("SELECT count(*) FROM saga_blobs"))

            await eventually(blobs, until=lambda n: n == 1)
        finally:
            await conn.close()
        engine.evict(saga_id)
        first = (await engine.history(saga_id))[0]
        assert isinstance(first, SagaStarted)
        assert first.input["pdf"]


async def _status(worker: SagaWorker, saga_id: str, status: SagaStatus) -> bool:
    engine = worker.engine
    assert engine is not None
    return (await engine.get(saga_id)).status is status


async def test_the_admin_api_shows_the_document_and_a_missing_blob_as_such(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    base = real_settings(pg, kafka_bootstrap, unique_id)
    blobs = BlobSettings(threshold_bytes=64 * 1024, mac_key=SecretStr(MAC))
    settings = base.model_copy(update={"codec": CodecSettings(blobs=blobs)})
    pdf = document(0.5)
    reader = {"Authorization": f"Bearer {READER_TOKEN}"}
    async with served_worker(settings, [FileInvoice]) as served:
        engine = served.worker.engine
        assert engine is not None
        saga_id = await engine.start(FileInvoice, Document(pdf=pdf))
        shown = await served.http.get(f"/sagas/{saga_id}/history", headers=reader)
        assert shown.status_code == 200, shown.text
        assert pdf in shown.text
        conn = await asyncpg.connect(pg.dsn)
        try:
            await conn.execute("DELETE FROM saga_blobs")
        finally:
            await conn.close()
        engine.evict(saga_id)
        gone = await served.http.get(f"/sagas/{saga_id}/history", headers=reader)
        assert gone.status_code == 200, gone.text
        assert pdf not in gone.text
        assert "blob_missing" in gone.text

"""Commands and replies by reference (docs/large-payloads.md, "Kafka records") on the
real servers: a saga whose command and reply are both above the message size runs
through a Python participant, each record carrying a reference; a forged reference, a
reference to a missing blob and a tampered blob are dead-lettered (``blob_tampered``,
``blob_missing``) by the engine and by the participant, the saga not driven, and the
records behind them keep flowing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import orjson
import pytest
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel, SecretStr

from saga_engine import Saga, SagaContext, SagaStatus, Settings
from saga_engine.events import SagaCompleted
from saga_engine.participant import Participant, Transaction
from saga_engine.protocol import Envelope, MessageType, Topics, encode
from saga_engine.settings import (
    AdminSettings,
    BlobSettings,
    CodecSettings,
    KafkaSettings,
    ParticipantSettings,
    PostgresSettings,
)
from saga_engine.store import PostgresEventStore, migrate
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.edge.conftest import dead_letters
from tests.integration.kafka_helpers import read_topic, read_topic_to_end
from tests.integration.test_large_payloads import document
from tests.waiting import eventually

pytestmark = pytest.mark.integration

MAC_KEY = b"a MAC key of 32 bytes, for tests"
THRESHOLD = 64 * 1024


class Document(BaseModel):
    pdf: str


class Archive(BaseModel):
    pdf: str


class Archived(BaseModel):
    pdf: str
    sha256: str


class Receipt(BaseModel):
    size: int
    sha256: str


class ArchiveDocument(Saga[Document, Receipt]):
    name = "archive-document"

    async def run(self, ctx: SagaContext, input: Document) -> Receipt:
        # Upper case: the command's blob is not the input's (each is kept for itself).
        command = Archive(pdf=input.pdf.upper())
        archived = await ctx.step("archive", to="archive", command=command, returns=Archived)
        return Receipt(size=len(archived.pdf), sha256=archived.sha256)


def settings_for(
    pg: PgTarget, bootstrap: str, *, encrypted: bool = False, max_bytes: int = 64 << 20
) -> Settings:
    tag = uuid.uuid4().hex[:10]
    blobs = BlobSettings(
        threshold_bytes=THRESHOLD,
        mac_keys={"k1": SecretStr(base64.b64encode(MAC_KEY).decode())},
        max_bytes=max_bytes,
    )
    return Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=bootstrap, topic_prefix=f"ref{tag}", group_id=f"ref-{tag}"
        ),
        participant=ParticipantSettings(dsn=SecretStr(pg.database_dsn), db_schema=f"{pg.schema}_p"),
        admin=AdminSettings(enabled=False, port=0),
        # Encrypted: each payload's blob is its own (a fresh nonce), not shared by content.
        codec=CodecSettings(keys={"k1": SecretStr(base64.b64encode(MAC_KEY).decode())}, blobs=blobs)
        if encrypted
        else CodecSettings(blobs=blobs),
    )


def archive(settings: Settings, handled: list[int]) -> Participant:
    participant = Participant("archive", settings, stop_timeout_s=2.0)

    # Counted in memory, outside its transaction: a copy must not run it (the lock path).
    @participant.handles(Archive, effects="outside")
    async def keep(cmd: Archive, tx: Transaction) -> Archived:
        handled.append(len(cmd.pdf))
        # The reply is the document again, marked: as large as the command.
        pdf = cmd.pdf[::-1]
        return Archived(pdf=pdf, sha256=hashlib.sha256(pdf.encode()).hexdigest())

    return participant


def reference_value(sha256: str, size: int, *, kid: str = "k1", key: bytes = MAC_KEY) -> bytes:
    """A record's value holding a reference, as the ``ref`` codec writes it (PROTOCOL.md
    15.4): the marker of byte 1 and the reference's JSON."""
    mac = hmac.new(key, f"{kid}:{sha256}:{size}:postgres".encode(), hashlib.sha256).hexdigest()
    ref = {"sha256": sha256, "size": size, "store": "postgres", "kid": kid, "mac": mac}
    data = b"\x01" + orjson.dumps(ref)
    return orjson.dumps({"$codec": "ref", "data": base64.b64encode(data).decode()})


async def send_raw(settings: Settings, topic: str, envelope: Envelope, value: bytes) -> None:
    key, _, headers = encode(envelope)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(
            topic, value, key=key, headers=[*headers, ("saga-codec", b"ref")]
        )
    finally:
        await producer.stop()


async def test_a_command_and_a_reply_over_the_message_size_go_by_reference(
    pg: PgTarget, kafka_bootstrap: str
) -> None:
    settings = settings_for(pg, kafka_bootstrap)
    pdf = document(1.5)  # over kafka.max_message_bytes (1 MB), both ways
    assert len(pdf) > settings.kafka.max_message_bytes
    handled: list[int] = []
    async with SagaWorker(settings, [ArchiveDocument]) as worker, archive(settings, handled):
        engine = worker.engine
        assert engine is not None
        saga_id = await engine.start(ArchiveDocument, Document(pdf=pdf))
        record = await engine.wait(saga_id, timeout=60)
        assert record.status is SagaStatus.COMPLETED, record.error
        expected = hashlib.sha256(pdf.upper()[::-1].encode()).hexdigest()
        completed = (await engine.history(saga_id))[-1]
        assert isinstance(completed, SagaCompleted)
        assert completed.output == {"size": len(pdf), "sha256": expected}
        assert handled == [len(pdf)]
    topics = Topics.of(settings.kafka)
    [command] = await read_topic(settings.kafka, topics.commands("archive"), 1)
    [reply] = await read_topic(settings.kafka, topics.inbox, 1)
    digests = []
    for sent in (command, reply):
        assert dict(sent.headers)["saga-codec"] == b"ref"
        assert len(sent.value) < 2048  # a reference, not the document
        data = base64.b64decode(orjson.loads(sent.value)["data"])
        assert data[0] == 1
        digests.append(orjson.loads(data[1:])["sha256"])
    conn = await asyncpg.connect(pg.dsn)
    try:
        # Each record's blob is referenced by its saga: the sweeper keeps it while the
        # saga is kept.
        refs = await conn.fetch("SELECT digest FROM saga_blob_refs WHERE saga_id = $1", saga_id)
    finally:
        await conn.close()
    assert set(digests) <= {r["digest"] for r in refs}


async def test_hostile_references_are_dead_lettered_by_the_engine_and_the_participant(
    pg: PgTarget, kafka_bootstrap: str
) -> None:
    settings = settings_for(pg, kafka_bootstrap)
    topics = Topics.of(settings.kafka)
    gone = hashlib.sha256(b"a blob no one wrote").hexdigest()
    altered = b"the blob as it was written"
    altered_digest = hashlib.sha256(altered).hexdigest()
    handled: list[int] = []
    async with SagaWorker(settings, [ArchiveDocument]) as worker, archive(settings, handled):
        engine = worker.engine
        assert engine is not None
        conn = await asyncpg.connect(pg.dsn)
        try:
            # A blob altered in the store: its bytes no longer hash to its name.
            await conn.execute(
                "INSERT INTO saga_blobs (digest, data, size) VALUES ($1, $2, $3)",
                altered_digest,
                b"the blob as someone changed it",
                len(altered),
            )
        finally:
            await conn.close()
        hostile = [
            reference_value(gone, 100, key=b"not the key, but 32 bytes long!!"),  # forged
            reference_value(gone, 100),  # names a blob that is not there
            reference_value(altered_digest, len(altered)),  # a tampered blob
        ]
        for value in hostile:
            reply = Envelope(
                message_type=MessageType.REPLY,
                source="/hostile",
                saga_id=f"saga-{uuid.uuid4().hex[:8]}",
                command_id=str(uuid.uuid4()),
                body={},
            )
            await send_raw(settings, topics.inbox, reply, value)
            order = Envelope(
                message_type=MessageType.COMMAND,
                source="/hostile",
                subject="Archive",
                saga_id=f"saga-{uuid.uuid4().hex[:8]}",
                command_id=str(uuid.uuid4()),
                step="archive",
                reply_to=topics.inbox,
                body={},
            )
            await send_raw(settings, topics.commands("archive"), order, value)
        letters = await dead_letters(settings, 6)
        reasons = sorted((d["dlq_topic"].split(".")[-1], d["dlq_reason"]) for d in letters)
        assert reasons == sorted(
            [
                (end, reason)
                for end in ("inbox", "archive")
                for reason in ("blob_tampered", "blob_missing", "blob_tampered")
            ]
        )
        assert any(gone in d["dlq_detail"] and d["dlq_reason"] == "blob_missing" for d in letters)
        # Nothing else stopped: a saga by reference still runs through both.
        pdf = document(0.2)
        saga_id = await engine.start(ArchiveDocument, Document(pdf=pdf))
        record = await engine.wait(saga_id, timeout=60)
        assert record.status is SagaStatus.COMPLETED, record.error
        assert handled == [len(pdf)]  # the hostile commands never reached the handler


async def test_a_blob_missing_from_a_reply_leaves_the_saga_waiting_not_compensating(
    pg: PgTarget, kafka_bootstrap: str
) -> None:
    settings = settings_for(pg, kafka_bootstrap)
    topics = Topics.of(settings.kafka)
    async with SagaWorker(settings, [ArchiveDocument]) as worker:
        engine = worker.engine
        assert engine is not None
        saga_id = await engine.start(ArchiveDocument, Document(pdf="small"))

        async def issued() -> list[str]:
            history = await engine.history(saga_id)
            return [e.command_id for e in history if e.kind == "command_issued"]

        [command_id] = await eventually(issued, until=lambda ids: len(ids) == 1)
        before = await engine.get(saga_id)
        reply = Envelope(
            message_type=MessageType.REPLY,
            source="/participants/archive",
            saga_id=saga_id,
            command_id=command_id,
            body={},
        )
        gone = hashlib.sha256(b"a reply's blob, deleted").hexdigest()
        await send_raw(settings, topics.inbox, reply, reference_value(gone, 10))
        [letter] = await dead_letters(settings, 1)
        assert letter["dlq_reason"] == "blob_missing"
        after = await engine.get(saga_id)
        assert (after.status, after.last_seq) == (SagaStatus.RUNNING, before.last_seq)


async def test_a_command_in_flight_keeps_its_blob_through_a_sweep(
    pg: PgTarget, kafka_bootstrap: str
) -> None:
    """The participant is down while the command by reference waits in its partition;
    a sweep with no grace at all deletes nothing the record needs, and the participant,
    started later, resolves it. Encrypted, so that no event of the saga shares the
    command's blob: only the record's own reference keeps it."""
    settings = settings_for(pg, kafka_bootstrap, encrypted=True)
    pdf = document(0.5)
    handled: list[int] = []
    async with SagaWorker(settings, [ArchiveDocument]) as worker:
        engine = worker.engine
        assert engine is not None
        saga_id = await engine.start(ArchiveDocument, Document(pdf=pdf))
        topics = Topics.of(settings.kafka)
        [command] = await read_topic(settings.kafka, topics.commands("archive"), 1)
        data = base64.b64decode(orjson.loads(command.value)["data"])
        digest = orjson.loads(data[1:])["sha256"]
        store = await PostgresEventStore.connect(settings.pg)
        try:
            await store.sweep_blobs(timedelta(0))
        finally:
            await store.close()
        conn = await asyncpg.connect(pg.dsn)
        try:
            kept = await conn.fetchval("SELECT count(*) FROM saga_blobs WHERE digest = $1", digest)
        finally:
            await conn.close()
        assert kept == 1
        async with archive(settings, handled):
            record = await engine.wait(saga_id, timeout=60)
        assert record.status is SagaStatus.COMPLETED, record.error
        assert handled == [len(pdf)]


async def test_a_reply_over_the_largest_blob_is_refused_once_naming_the_setting(
    pg: PgTarget, kafka_bootstrap: str
) -> None:
    settings = settings_for(pg, kafka_bootstrap, max_bytes=128 * 1024)
    participant = Participant("archive", settings, stop_timeout_s=2.0)
    calls: list[int] = []

    @participant.handles(Archive)
    async def swell(cmd: Archive, tx: Transaction) -> Archived:
        calls.append(1)
        return Archived(pdf="x" * 200 * 1024, sha256="")  # by reference, over max_bytes

    async with SagaWorker(settings, [ArchiveDocument]) as worker, participant:
        engine = worker.engine
        assert engine is not None
        saga_id = await engine.start(ArchiveDocument, Document(pdf="small"))
        record = await engine.wait(saga_id, timeout=60)
    assert record.status is not SagaStatus.COMPLETED
    assert "SAGA_CODEC__BLOBS__MAX_BYTES" in str(record.error)
    assert calls == [1]


async def test_a_duplicate_command_gets_the_stored_reply_by_reference_again(
    pg: PgTarget, kafka_bootstrap: str
) -> None:
    """A command by reference delivered twice is applied once; the copy is answered with
    the stored reply, itself a reference, resolved and sent again."""
    settings = settings_for(pg, kafka_bootstrap)
    topics = Topics.of(settings.kafka)
    body = orjson.dumps({"pdf": document(0.2)})
    digest = hashlib.sha256(body).hexdigest()
    await migrate(pg.database_dsn, pg.schema)  # the engine's tables: its blob store
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute(
            "INSERT INTO saga_blobs (digest, data, size) VALUES ($1, $2, $3)",
            digest,
            body,
            len(body),
        )
        command = Envelope(
            message_type=MessageType.COMMAND,
            source="/saga-engine",
            subject="Archive",
            saga_id="saga-dup",
            command_id=str(uuid.uuid4()),
            step="archive",
            reply_to=topics.inbox,
            body={},
        )
        handled: list[int] = []
        async with archive(settings, handled):
            for _ in range(2):
                await send_raw(
                    settings,
                    topics.commands("archive"),
                    command,
                    reference_value(digest, len(body)),
                )
            replies = await read_topic(settings.kafka, topics.inbox, 2)
        assert handled == [len(body) - len('{"pdf":""}')]
        payloads = []
        for reply in replies:
            data = base64.b64decode(orjson.loads(reply.value)["data"])
            ref = orjson.loads(data[1:])
            blob = await conn.fetchval(
                "SELECT data FROM saga_blobs WHERE digest = $1", ref["sha256"]
            )
            payloads.append(orjson.loads(blob)["payload"])
        assert payloads[0] == payloads[1]
        assert len(payloads[0]["pdf"]) == handled[0]
    finally:
        await conn.close()


async def test_a_saga_by_reference_finishes_after_the_mac_key_is_rotated(
    pg: PgTarget, kafka_bootstrap: str
) -> None:
    """The input and the command are referenced under key k1; the engine restarts with
    k2 current and k1 kept, the participant too: the command made under k1 resolves, the
    reply goes under k2, and the saga completes."""
    before = settings_for(pg, kafka_bootstrap)
    rotated_blobs = before.codec.blobs.model_copy(
        update={
            "mac_keys": {
                "k1": SecretStr(base64.b64encode(MAC_KEY).decode()),
                "k2": SecretStr(base64.b64encode(b"the next MAC key, 32 bytes long!").decode()),
            },
            "current_mac_key": "k2",
        }
    )
    after = before.model_copy(update={"codec": CodecSettings(blobs=rotated_blobs)})
    pdf = document(0.2)
    async with SagaWorker(before, [ArchiveDocument]) as worker:
        engine = worker.engine
        assert engine is not None
        saga_id = await engine.start(ArchiveDocument, Document(pdf=pdf))
        topics = Topics.of(before.kafka)
        [command] = await read_topic(before.kafka, topics.commands("archive"), 1)
    handled: list[int] = []
    async with SagaWorker(after, [ArchiveDocument]) as worker, archive(after, handled):
        engine = worker.engine
        assert engine is not None
        record = await engine.wait(saga_id, timeout=60)
        assert record.status is SagaStatus.COMPLETED, record.error
        inbox = await read_topic_to_end(after.kafka, topics.inbox)
    # The new engine re-sends the command in flight: each copy is answered (the second
    # with the stored reply), every answer under k2.
    replies = [r for r in inbox if dict(r.headers).get("ce_type") == b"saga.reply"]
    assert replies

    def kid(sent: Any) -> str:
        data = base64.b64decode(orjson.loads(sent.value)["data"])
        return str(orjson.loads(data[1:])["kid"])

    assert kid(command) == "k1"
    assert {kid(r) for r in replies} == {"k2"}
    assert handled == [len(pdf)]

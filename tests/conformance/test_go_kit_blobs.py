"""Commands and replies by reference through the Go kit (kits/go, ``BlobConfig``): a
saga whose command and reply are both above the message size runs through the Go
conformance participant (``ConformanceEcho``), each record carrying a reference; a
forged reference and a reference to a missing blob are dead-lettered by the Go kit
(``blob_tampered``, ``blob_missing``), never answered, and the next command goes on."""

from __future__ import annotations

import base64
import hashlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import BaseModel, SecretStr

from saga_engine import Saga, SagaContext, SagaStatus, Settings
from saga_engine.events import SagaCompleted
from saga_engine.protocol import Envelope, MessageType, Topics
from saga_engine.settings import (
    AdminSettings,
    BlobSettings,
    CodecSettings,
    KafkaSettings,
    PostgresSettings,
)
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.edge.conftest import dead_letters
from tests.go_kit import build_binary, running
from tests.integration.test_large_payloads import document
from tests.integration.test_large_records import reference_value, send_raw
from tests.participant.helpers import delete_topics
from tests.waiting import scaled

pytestmark = pytest.mark.integration

NAME = "echo-go"
MAC_KEY = b"a MAC key of 32 bytes, for tests"


class Echo(BaseModel):
    text: str


class Echoed(BaseModel):
    text: str


class EchoDocument(Saga[Echo, Echoed]):
    name = "echo-document"

    async def run(self, ctx: SagaContext, input: Echo) -> Echoed:
        return await ctx.step(
            "echo", to=NAME, command=ConformanceEcho(text=input.text), returns=Echoed
        )


class ConformanceEcho(BaseModel):
    text: str


def settings_for(pg: PgTarget, bootstrap: str) -> Settings:
    tag = uuid.uuid4().hex[:10]
    blobs = BlobSettings(
        threshold_bytes=64 * 1024,
        mac_keys={"k1": SecretStr(base64.b64encode(MAC_KEY).decode())},
    )
    return Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=bootstrap, topic_prefix=f"gref{tag}", group_id=f"gref-{tag}"
        ),
        admin=AdminSettings(enabled=False, port=0),
        codec=CodecSettings(blobs=blobs),
    )


@pytest.fixture
async def go_echo(
    go_built: str,
    pg: PgTarget,
    kafka_bootstrap: str,
    unique_id: str,
    tmp_path: Path,
) -> AsyncIterator[Settings]:
    binary = await build_binary(
        go_built, "./cmd/conformance-participant", tmp_path / "conformance-participant"
    )
    settings = settings_for(pg, kafka_bootstrap)
    env = {
        **os.environ,
        "SAGA_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "SAGA_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
        "SAGA_PG__DSN": pg.database_dsn,
        "SAGA_PG__DB_SCHEMA": pg.schema,
        "SAGA_PARTICIPANT__NAME": NAME,
        "SAGA_PARTICIPANT__SCHEMA": f"go_{uuid.uuid4().hex[:10]}",
        "SAGA_PARTICIPANT__INSTANCE_ID": f"{NAME}-{unique_id}",
        "SAGA_CODEC__BLOBS__THRESHOLD_BYTES": "65536",
        "SAGA_CODEC__BLOBS__MAC_KEYS": f'{{"k1": "{base64.b64encode(MAC_KEY).decode()}"}}',
    }
    try:
        async with running(binary, env):
            yield settings
    finally:
        await delete_topics(kafka_bootstrap, settings.kafka.topic_prefix)


def _command(topics: Topics) -> Envelope:
    return Envelope(
        message_type=MessageType.COMMAND,
        source="/hostile",
        subject="ConformanceEcho",
        saga_id=f"saga-{uuid.uuid4().hex[:8]}",
        command_id=str(uuid.uuid4()),
        step="echo",
        reply_to=topics.inbox,
        body={},
    )


@pytest.mark.timeout(300, func_only=True)
async def test_the_go_kit_takes_and_answers_by_reference_and_dead_letters_hostile_ones(
    go_echo: Settings,
) -> None:
    settings = go_echo
    topics = Topics.of(settings.kafka)
    text = document(1.5)  # over the message size both ways
    async with SagaWorker(settings, [EchoDocument]) as worker:
        engine = worker.engine
        assert engine is not None
        saga_id = await engine.start(EchoDocument, Echo(text=text))
        record = await engine.wait(saga_id, timeout=scaled(120))
        assert record.status is SagaStatus.COMPLETED, record.error
        completed = (await engine.history(saga_id))[-1]
        assert isinstance(completed, SagaCompleted)
        assert completed.output == {"text": text[::-1]}
        gone = hashlib.sha256(b"a blob no one wrote").hexdigest()
        forged = reference_value(gone, 100, key=b"not the key, but 32 bytes long!!")
        for value in (forged, reference_value(gone, 100)):
            await send_raw(settings, topics.commands(NAME), _command(topics), value)
        letters = await dead_letters(settings, 2)
        assert sorted(d["dlq_reason"] for d in letters) == ["blob_missing", "blob_tampered"]
        # The partition goes on: the next saga by reference runs.
        again = await engine.start(EchoDocument, Echo(text=text[:100_000]))
        record = await engine.wait(again, timeout=scaled(120))
        assert record.status is SagaStatus.COMPLETED, record.error

"""Records compressed by any client are read (issue 22 §5), on the real broker.

- Each codec Kafka has (gzip, snappy, lz4, zstd), produced by aiokafka's producer as
  another team's client would: start requests through the engine's inbox, trigger
  messages through a ``KafkaTrigger``, commands through a participant.
- A fetch that no retry can cure (a codec this process lacks, simulated by hiding
  snappy from aiokafka) is reported: an ERROR naming the topic, partition and offset,
  the ``saga.kafka.fetch.unreadable`` metric, a degraded health; the partition waits
  and the other partitions go on, none of their records lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator

import aiokafka.codec
import orjson
import pytest
from aiokafka import AIOKafkaProducer
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from pydantic import BaseModel, SecretStr

from saga_engine import Saga, SagaContext, SagaNotFound, SagaStatus, Settings, saga_id_for
from saga_engine.participant import Participant, Transaction
from saga_engine.protocol import Envelope, MessageType, Topics, encode
from saga_engine.settings import (
    AdminSettings,
    KafkaSettings,
    ParticipantSettings,
    PostgresSettings,
)
from saga_engine.telemetry import Telemetry
from saga_engine.triggers import KafkaTrigger
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.integration.kafka_helpers import ensure_topics
from tests.participant.helpers import command
from tests.waiting import eventually

pytestmark = pytest.mark.integration

CODECS = ("gzip", "snappy", "lz4", "zstd")


class Nothing(BaseModel):
    pass


class Booked(BaseModel):
    key: str


class Instant(Saga[Nothing, Nothing]):
    name = "instant"

    async def run(self, ctx: SagaContext, input: Nothing) -> Nothing:
        return Nothing()


class Seat(BaseModel):
    n: int


def _settings(pg: PgTarget, bootstrap: str, partitions: int = 2) -> Settings:
    tag = uuid.uuid4().hex[:10]
    return Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=bootstrap,
            topic_prefix=f"codec{tag}",
            group_id=f"codec-{tag}",
            partitions=partitions,
        ),
        participant=ParticipantSettings(dsn=SecretStr(pg.database_dsn), db_schema=f"{pg.schema}_p"),
        admin=AdminSettings(enabled=False, port=0),
    )


@contextlib.asynccontextmanager
async def compressing(bootstrap: str) -> AsyncIterator[dict[str, AIOKafkaProducer]]:
    """A producer per codec: each sends its batches compressed with it."""
    producers = {
        c: AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=c) for c in CODECS
    }
    await asyncio.gather(*(p.start() for p in producers.values()))
    try:
        yield producers
    finally:
        await asyncio.gather(*(p.stop() for p in producers.values()))


def _start_request(saga_id: str) -> Envelope:
    return Envelope(
        message_type=MessageType.START,
        source="/another-team",
        subject=Instant.name,
        saga_id=saga_id,
        saga_type=Instant.name,
        correlation_id=saga_id,
        body={"input": {}},
    )


def _seats(
    settings: Settings, handled: list[int], telemetry: Telemetry | None = None
) -> Participant:
    participant = Participant("seats", settings, stop_timeout_s=2.0, telemetry=telemetry)

    @participant.handles(Seat)
    async def seat(cmd: Seat, tx: Transaction) -> None:
        handled.append(cmd.n)

    return participant


async def test_every_codec_reads_through_the_inbox_and_a_trigger(
    pg: PgTarget, kafka_bootstrap: str
) -> None:
    settings = _settings(pg, kafka_bootstrap)
    topic = f"{settings.kafka.topic_prefix}.bookings"
    await ensure_topics(settings.kafka, [topic])
    trigger = KafkaTrigger(
        topic=topic,
        saga=Instant,
        message=Booked,
        to_input=lambda m: Nothing(),
        idempotency_key=lambda m: m.key,
    )
    inbox = Topics.of(settings.kafka).inbox
    async with (
        SagaWorker(settings, [Instant], triggers=[trigger]) as worker,
        compressing(kafka_bootstrap) as producers,
    ):
        for codec, producer in producers.items():
            key, value, headers = encode(_start_request(f"inbox-{codec}"))
            await producer.send_and_wait(inbox, value, key=key, headers=headers)
            await producer.send_and_wait(topic, orjson.dumps({"key": f"trigger-{codec}"}))
        engine = worker.engine
        assert engine is not None
        ids = [f"inbox-{c}" for c in CODECS] + [
            saga_id_for(Instant.name, f"trigger-{c}") for c in CODECS
        ]

        async def status(saga_id: str) -> SagaStatus | None:
            with contextlib.suppress(SagaNotFound):
                return (await engine.get(saga_id)).status
            return None

        async def all_completed() -> bool:
            return all([await status(i) == SagaStatus.COMPLETED for i in ids])

        await eventually(all_completed, timeout=30)
        assert worker.health.status == "ok"


async def test_every_codec_reads_in_a_participant(pg: PgTarget, kafka_bootstrap: str) -> None:
    settings = _settings(pg, kafka_bootstrap)
    handled: list[int] = []
    topic = Topics.of(settings.kafka).commands("seats")
    async with _seats(settings, handled) as participant, compressing(kafka_bootstrap) as producers:
        for n, producer in enumerate(producers.values()):
            key, value, headers = encode(command("Seat", {"n": n}))
            await producer.send_and_wait(topic, value, key=key, headers=headers)
        await eventually(lambda: sorted(handled) == list(range(len(CODECS))), timeout=30)
        assert participant.health.status == "ok"


async def test_a_partition_no_fetch_can_read_is_reported_and_the_others_go_on(
    pg: PgTarget,
    kafka_bootstrap: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = _settings(pg, kafka_bootstrap)
    topic = Topics.of(settings.kafka).commands("seats")
    await ensure_topics(settings.kafka, [topic])
    async with compressing(kafka_bootstrap) as producers:
        # Partition 0: a snappy batch first. Partition 1: plain records, before and after.
        for n in range(3):
            key, value, headers = encode(command("Seat", {"n": 100 + n}))
            await producers["gzip"].send_and_wait(
                topic, value, key=key, headers=headers, partition=1
            )
        key, value, headers = encode(command("Seat", {"n": 0}))
        await producers["snappy"].send_and_wait(topic, value, key=key, headers=headers, partition=0)
    # As in a process installed without the snappy codec.
    monkeypatch.setattr(aiokafka.codec, "has_snappy", lambda: False)
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    handled: list[int] = []
    caplog.set_level(logging.ERROR, logger="saga_engine.kafka")
    async with _seats(settings, handled, telemetry=telemetry) as participant:
        await eventually(lambda: participant.health.status == "degraded", timeout=30)
        # The readable partition's records are all handled, none lost to the failed fetch.
        await eventually(lambda: sorted(handled) == [100, 101, 102], timeout=30)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            key, value, headers = encode(command("Seat", {"n": 103}))
            await producer.send_and_wait(topic, value, key=key, headers=headers, partition=1)
        finally:
            await producer.stop()
        await eventually(lambda: 103 in handled, timeout=30)
        assert 0 not in handled
        [problem] = participant.health.problems
        assert f"{topic}[0] at offset 0" in problem
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(f"cannot read {topic}[0] at offset 0" in e and "snappy" in e for e in errors)
    data = reader.get_metrics_data()
    assert data is not None
    points = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "saga.kafka.fetch.unreadable"
        for p in m.data.data_points
        if isinstance(p, NumberDataPoint)
    ]
    assert [(dict(p.attributes or {}), p.value) for p in points] == [
        ({"topic": topic, "partition": 0}, 1)
    ]

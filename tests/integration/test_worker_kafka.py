"""The engine worker on the real Kafka and Postgres: inbox, commands, DLQ, idempotent start."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from saga_engine import (
    ResultTimeout,
    Saga,
    SagaContext,
    SagaStatus,
    SagaUnsuccessful,
    Settings,
)
from saga_engine.client import SagaClient
from saga_engine.protocol import Envelope, MessageType, ReplyBody, encode
from saga_engine.settings import AdminSettings, EngineSettings, KafkaSettings, PostgresSettings
from saga_engine.store import NewSaga, PostgresEventStore, StoreUnavailable
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.integration.kafka_helpers import fake_participant, read_topic
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class Order(BaseModel):
    n: int = 1


class Done(BaseModel):
    ok: bool = True


class Cmd(BaseModel):
    n: int


class Undo(BaseModel):
    n: int


class Two(Saga[Order, Done]):
    name = "two-steps"

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        await ctx.step("first", to="alpha", command=Cmd(n=input.n), compensate=Undo(n=input.n))
        await ctx.step("second", to="beta", command=Cmd(n=input.n))
        return Done()


@pytest.fixture
def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> Settings:
    return Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=f"t{unique_id}",
            group_id=f"engines-{unique_id}",
            partitions=3,
        ),
        engine=EngineSettings(),
        admin=AdminSettings(port=0),
    )


@pytest.fixture
async def worker(settings: Settings) -> AsyncIterator[SagaWorker]:
    w = SagaWorker(settings, [Two])
    await w.start()
    yield w
    await w.stop()


async def _status(worker: SagaWorker, saga_id: str) -> SagaStatus | None:
    assert worker.engine is not None
    try:
        return (await worker.engine.get(saga_id)).status
    except Exception:
        return None


async def test_saga_started_through_the_inbox_completes(
    settings: Settings, worker: SagaWorker
) -> None:
    async with (
        fake_participant(settings, "alpha") as alpha,
        fake_participant(settings, "beta") as beta,
        SagaClient(settings) as client,
    ):
        saga_id = await client.start(Two, Order(n=7), idempotency_key="order-7")
        again = await client.start(Two, Order(n=7), idempotency_key="order-7")
        assert again == saga_id
        await eventually(lambda: _is(worker, saga_id, SagaStatus.COMPLETED))
        assert [c.body for c in alpha] == [{"n": 7}]
        assert len(beta) == 1
        command = alpha[0]
        assert command.saga_id == saga_id
        assert command.saga_type == "two-steps"
        assert command.command_id
        assert command.reply_to == f"{settings.kafka.topic_prefix}.inbox"
        sagas = await worker.parts.store.list_sagas()
        assert len(sagas) == 1


async def _is(worker: SagaWorker, saga_id: str, status: SagaStatus) -> bool:
    return await _status(worker, saga_id) == status


async def test_refusal_compensates_over_kafka(settings: Settings, worker: SagaWorker) -> None:
    def refuse(_: Envelope) -> ReplyBody:
        return ReplyBody(outcome="failure", error="beta is closed")

    async with (
        fake_participant(settings, "alpha") as alpha,
        fake_participant(settings, "beta", refuse),
        SagaClient(settings) as client,
    ):
        saga_id = await client.start(Two, Order(n=3))
        await eventually(lambda: _is(worker, saga_id, SagaStatus.COMPENSATED))
        assert [(c.subject, c.compensation) for c in alpha] == [("Cmd", False), ("Undo", True)]


async def test_result_waits_for_the_end_from_any_process(
    settings: Settings, worker: SagaWorker
) -> None:
    """``SagaClient.result``: the output (as the saga's model, or JSON), the error of a
    saga that ended otherwise, and a timeout while the saga waits, through Postgres."""

    def refuse_second(envelope: Envelope) -> ReplyBody:
        if envelope.body.get("n") == 2:
            return ReplyBody(outcome="failure", error="beta is closed")
        return ReplyBody(outcome="success")

    async with (
        fake_participant(settings, "alpha"),
        SagaClient(settings) as client,
    ):
        done = await client.start(Two, Order(n=1))
        refused = await client.start(Two, Order(n=2))
        # Nobody answers beta yet: both wait there, and a short wait times out.
        with pytest.raises(ResultTimeout, match="still running") as timed_out:
            await client.result(done, timeout=0.3)
        assert timed_out.value.status == "running"
        with pytest.raises(ResultTimeout, match="does not exist"):
            await client.result("no-such-saga", timeout=0.1)
        async with fake_participant(settings, "beta", refuse_second):
            assert await client.result(done, timeout=30, saga=Two) == Done(ok=True)
            assert await client.result(done, timeout=timedelta(seconds=5)) == {"ok": True}
            with pytest.raises(SagaUnsuccessful) as ended:
                await client.result(refused, timeout=30)
    assert ended.value.status == "compensated"
    assert ended.value.error["type"] == "StepFailed"
    assert "beta is closed" in str(ended.value)


async def test_poison_messages_go_to_the_dlq_and_the_partition_keeps_flowing(
    settings: Settings, worker: SagaWorker
) -> None:
    inbox = f"{settings.kafka.topic_prefix}.inbox"
    key = b"poison-key"  # every record on the same partition
    good = Envelope(
        message_type=MessageType.START,
        source="/t",
        saga_id="poison-key",
        saga_type="two-steps",
        body={"input": {"n": 1}},
    )
    _, good_value, good_headers = encode(good)

    def headers_with(**changes: str) -> list[tuple[str, bytes]]:
        out = [(k, v) for k, v in good_headers if k not in changes]
        return out + [(k, v.encode()) for k, v in changes.items()]

    reply_unknown_saga = encode(
        Envelope(
            message_type=MessageType.REPLY,
            source="/t",
            saga_id="poison-key-ghost",
            command_id="c-1",
            body={"outcome": "success"},
        )
    )
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        sends = [
            (key, b"{not json", good_headers),
            (key, good_value, headers_with(ce_schemaversion="99")),
            (key, good_value, headers_with(ce_type="saga.unheard-of")),
            (
                key,
                b'{"input": "' + b"x" * (settings.kafka.max_message_bytes + 10) + b'"}',
                good_headers,
            ),
            (key, orjson.dumps({"input": {"n": "lots"}}), good_headers),
            (reply_unknown_saga[0], reply_unknown_saga[1], reply_unknown_saga[2]),
            (key, good_value, [(k, v) for k, v in good_headers if k != "ce_sagaid"]),
        ]
        for k, v, h in sends:
            await producer.send_and_wait(inbox, v, key=k, headers=h)
        async with fake_participant(settings, "alpha"), fake_participant(settings, "beta"):
            await producer.send_and_wait(inbox, good_value, key=key, headers=good_headers)
            await eventually(lambda: _is(worker, "poison-key", SagaStatus.COMPLETED))
            # A reply for a command the saga never issued, after it exists.
            stray = encode(
                Envelope(
                    message_type=MessageType.REPLY,
                    source="/t",
                    saga_id="poison-key",
                    command_id=str(uuid.uuid4()),
                    body={"outcome": "success"},
                )
            )
            await producer.send_and_wait(inbox, stray[1], key=stray[0], headers=stray[2])
            records = await read_topic(settings.kafka, f"{settings.kafka.topic_prefix}.dlq", 8)
    finally:
        await producer.stop()
    reasons = sorted(dict(r.headers)["dlq_reason"].decode() for r in records)
    assert reasons == sorted(
        [
            "malformed_json",
            "wrong_schema_version",
            "unknown_type",
            "oversized",
            "invalid_input",
            "unknown_saga",
            "missing_header",
            "unknown_command",
        ]
    )
    for record in records:
        headers = dict(record.headers)
        assert headers["dlq_topic"].decode() == inbox
        assert int(headers["dlq_offset"]) >= 0
    assert worker.engine is not None
    assert worker.parts.stats.counts["dead_lettered"] == 8


async def test_a_start_left_unapplied_at_stop_is_read_again_by_the_next_worker(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker stopped while Postgres refuses a start's write must not commit that
    record's offset: the next worker of the group reads it again and starts the saga."""
    attempts: list[str] = []

    async def refuse(self: PostgresEventStore, new: NewSaga) -> bool:
        attempts.append(new.saga_id)
        raise StoreUnavailable("injected: Postgres is away")

    monkeypatch.setattr(PostgresEventStore, "create", refuse)
    first = SagaWorker(settings, [Two])
    await first.start()
    try:
        async with SagaClient(settings) as client:
            saga_id = await client.start(Two, Order(n=5))
        # The batch path and then the single path try to create it, and keep retrying.
        await eventually(lambda: len(attempts) >= 2)
    finally:
        await first.stop()
    assert set(attempts) == {saga_id}

    monkeypatch.undo()
    second = SagaWorker(settings, [Two])
    await second.start()
    try:
        async with (
            fake_participant(settings, "alpha"),
            fake_participant(settings, "beta"),
        ):
            await eventually(lambda: _is(second, saga_id, SagaStatus.COMPLETED))
    finally:
        await second.stop()

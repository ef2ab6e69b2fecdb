"""Every Kafka consumer comes from one factory (``_kafka.make_consumer``), so each gets the
same size limits. Pinned without a broker: aiokafka's consumer class is replaced by one
that records how it was made. And a trigger consumer's stop collects its loop's outcome."""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from aiokafka.structs import TopicPartition
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, Settings
from saga_engine.kernel._errors import TransientError
from saga_engine.runner._trigger_consumer import TriggerConsumer
from saga_engine.settings import KafkaSettings
from saga_engine.transport import _kafka as kafka_module
from saga_engine.transport._dlq import DeadLetterTopic
from saga_engine.transport._kafka import make_consumer, make_group_consumer
from saga_engine.transport._wire import Envelope
from saga_engine.triggers import KafkaTrigger
from saga_engine.worker._adapters import trigger_consumer

# Above aiokafka's defaults and the factory's 50 MiB floor: a consumer without the
# limits shows.
LIMIT = 30_000_000
SIZE_LIMITS = {
    "max_partition_fetch_bytes": LIMIT + 64 * 1024,
    "fetch_max_bytes": 2 * LIMIT,
}


class FakeConsumer:
    """Records its topics and options; fetches nothing."""

    made: ClassVar[list[tuple[tuple[str, ...], dict[str, Any]]]] = []

    def __init__(self, *topics: str, **options: Any) -> None:
        self.made.append((topics, options))
        self._client = self

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def getmany(self, *_: Any, **__: Any) -> dict[Any, Any]:
        await asyncio.sleep(0)  # a fetch that found nothing: let the stop come in
        return {}

    async def fetch_all_metadata(self) -> Any:
        return self

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set()  # no dead-letter topic: the dlq reader stops right after making it


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    FakeConsumer.made = []
    monkeypatch.setattr(kafka_module, "AIOKafkaConsumer", FakeConsumer)
    return FakeConsumer.made


def settings() -> Settings:
    return Settings(kafka=KafkaSettings(max_message_bytes=LIMIT, group_id="engines"))


class Order(BaseModel):
    n: int


class Noop(Saga[Order, Order]):
    name = "noop"

    async def run(self, ctx: SagaContext, input: Order) -> Order:
        return input


async def test_the_factory_makes_aiokafka_consumers_with_the_size_limits() -> None:
    consumer = make_consumer(settings().kafka, "a", "b", group_id=None)
    try:
        assert consumer._max_partition_fetch_bytes == SIZE_LIMITS["max_partition_fetch_bytes"]
        assert consumer._fetch_max_bytes == SIZE_LIMITS["fetch_max_bytes"]
        assert consumer._enable_auto_commit is False  # committed after the work is durable
        assert consumer.subscription() == {"a", "b"}
    finally:
        await consumer.stop()  # never started: only marks it closed


async def test_the_trigger_consumer_gets_the_size_limits(
    made: list[tuple[tuple[str, ...], dict[str, Any]]],
) -> None:
    trigger = KafkaTrigger(
        topic="orders.requested",
        saga=Noop,
        message=Order,
        to_input=lambda m: m,
        idempotency_key=lambda m: str(m.n),
    )
    # The worker makes it, with the factory's consumer.
    consumer = trigger_consumer(settings(), [trigger], producer=None, dead=None, source="/t")  # type: ignore[arg-type]
    await consumer.start()
    await consumer.stop()

    [(topics, options)] = made
    assert topics == ("orders.requested",)
    assert options["group_id"] == "engines.triggers"
    assert options["enable_auto_commit"] is False
    assert {k: options[k] for k in SIZE_LIMITS} == SIZE_LIMITS


async def test_the_group_and_cli_consumers_get_the_same_size_limits(
    made: list[tuple[tuple[str, ...], dict[str, Any]]],
) -> None:
    make_group_consumer(settings().kafka, group_id="g", client_id="c", instance_name="i")
    with pytest.raises(Exception, match="does not exist"):
        await DeadLetterTopic(settings().kafka).newest(None, 1.0)

    assert len(made) == 2
    for _, options in made:
        assert {k: options[k] for k in SIZE_LIMITS} == SIZE_LIMITS
    assert made[0][1]["group_instance_id"] == "i"
    assert made[1][1]["group_id"] is None


# A trigger consumer stopped while it retries a start request ends cleanly: the record
# whose start request could not be published is not committed (read again after a
# restart), and the loop's task ends with the ``TransientError`` that stopped the retry.
# ``stop`` must collect that outcome, or asyncio logs "Task exception was never
# retrieved" when the task is collected.

TOPIC = "orders.requested"


class OneRecordConsumer:
    """Hands out one trigger record, then nothing; records what was committed."""

    def __init__(self) -> None:
        self._client = self
        self.committed: list[dict[Any, int]] = []
        self._records = [
            SimpleNamespace(
                topic=TOPIC, partition=0, offset=0, key=None, value=b'{"n": 1}', headers=[]
            )
        ]

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def commit(self, offsets: dict[Any, int]) -> None:
        self.committed.append(offsets)

    async def getmany(self, *_: Any, **__: Any) -> dict[Any, Any]:
        await asyncio.sleep(0)
        if not self._records:
            return {}
        records, self._records = self._records, []
        return {TopicPartition(TOPIC, 0): records}


async def test_stopping_while_a_start_request_is_retried_collects_the_task() -> None:
    attempts = asyncio.Event()

    async def publish(_: Envelope) -> None:
        attempts.set()
        raise TransientError("the broker is away")

    kafka = OneRecordConsumer()
    trigger = KafkaTrigger(
        topic=TOPIC,
        saga=Noop,
        message=Order,
        to_input=lambda m: m,
        idempotency_key=lambda m: str(m.n),
    )
    consumer = TriggerConsumer(
        [trigger],
        kafka,
        group="g.triggers",
        publish=publish,
        dead=None,  # type: ignore[arg-type]
        source="/t",
    )
    reported: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    gc.collect()  # what earlier tests left is reported before the handler is set
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        await consumer.start()
        await asyncio.wait_for(attempts.wait(), timeout=30)
        await consumer.stop()
        del consumer
        gc.collect()
    finally:
        loop.set_exception_handler(None)

    ours = [c for c in reported if getattr(c.get("future"), "get_name", str)() == "saga-triggers"]
    assert [c["message"] for c in ours] == []
    assert kafka.committed == []  # the record is read again after a restart

"""A trigger consumer stopped while it retries a start request ends cleanly.

The record whose start request could not be published is not committed (it is read again
after a restart), and the consumer's task ends with the ``TransientError`` that stopped the
retry: ``stop`` must collect that outcome, or asyncio logs "Task exception was never
retrieved" when the task is collected.
"""

from __future__ import annotations

import asyncio
import gc
from types import SimpleNamespace
from typing import Any

from aiokafka.structs import TopicPartition
from pydantic import BaseModel

from saga_engine import Saga, SagaContext
from saga_engine.kernel._errors import TransientError
from saga_engine.runner._trigger_consumer import TriggerConsumer
from saga_engine.transport._wire import Envelope
from saga_engine.triggers import KafkaTrigger

TOPIC = "orders.requested"


class Order(BaseModel):
    n: int


class Noop(Saga[Order, Order]):
    name = "noop"

    async def run(self, ctx: SagaContext, input: Order) -> Order:
        return input


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
    unretrieved: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    try:
        await consumer.start()
        await asyncio.wait_for(attempts.wait(), timeout=30)
        await consumer.stop()
        del consumer
        gc.collect()
    finally:
        loop.set_exception_handler(None)

    assert [c["message"] for c in unretrieved] == []
    assert kafka.committed == []  # the record is read again after a restart

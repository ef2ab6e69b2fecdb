"""Bad input at every edge, over the real servers: a worker (Postgres, Kafka, its admin
API on uvicorn), records produced on the real topics, participants on the real Kafka.

Each test sends the bad input through the path a real one takes, checks the answer, and
checks that the saga's history did not gain an event (or, for a participant's reply,
that the saga is parked and nothing was compensated).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pydantic import BaseModel, Field

from saga_engine import Saga, SagaContext, Settings, Signal
from saga_engine.protocol import Envelope, Topics, encode
from tests.conftest import PgTarget
from tests.integration.kafka_helpers import read_topic
from tests.served_worker import OPERATOR_TOKEN, ServedWorker, real_settings, served_worker
from tests.waiting import eventually

OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


class Go(BaseModel):
    ok: bool


class Order(BaseModel):
    customer: str = Field(min_length=1, max_length=50)
    amount: int = Field(default=1, gt=0)
    #: A fresh value whenever the caller gives none: a retry of the same request must
    #: still be recognised as the same.
    reference: str = Field(default_factory=lambda: uuid.uuid4().hex)


class Done(BaseModel):
    ok: bool
    receipt: str


class Charge(BaseModel):
    customer: str
    amount: int


class Refund(BaseModel):
    customer: str
    amount: int


class Charged(BaseModel):
    receipt: str
    amount: int


class LenientCharged(BaseModel):
    receipt: str
    amount: float


class Checkout(Saga[Order, Done]):
    """Charges the customer at the bank (its reply must be a Charged), then waits for go."""

    name = "edge-checkout"
    go = Signal(Go)
    #: The model the bank's reply must match.
    reply_model: ClassVar[type[Charged | LenientCharged]] = Charged

    async def run(self, ctx: SagaContext, order: Order) -> Done:
        charged = await ctx.step(
            "charge",
            to="bank",
            command=Charge(customer=order.customer, amount=order.amount),
            compensate=Refund(customer=order.customer, amount=order.amount),
            returns=self.reply_model,
            timeout=timedelta(minutes=5),
        )
        decision = await ctx.wait_signal(self.go, timeout=timedelta(hours=1))
        return Done(ok=decision.ok, receipt=charged.receipt)


class CheckoutFixed(Checkout):
    """The same saga, deployed with a fix: the bank's amounts may carry decimals."""

    name = "edge-checkout"
    reply_model = LenientCharged


@pytest.fixture
def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> Settings:
    return real_settings(pg, kafka_bootstrap, unique_id)


@pytest.fixture
async def served(settings: Settings) -> AsyncIterator[ServedWorker]:
    async with served_worker(settings, [Checkout]) as running:
        yield running


async def events(served: ServedWorker, saga_id: str) -> list[dict[str, Any]]:
    """The saga's history, read through the admin API."""
    response = await served.http.get(f"/sagas/{saga_id}/history", headers=OPERATOR)
    assert response.status_code == 200, response.text
    history: list[dict[str, Any]] = response.json()["events"]
    return history


async def status(served: ServedWorker, saga_id: str) -> str | None:
    response = await served.http.get(f"/sagas/{saga_id}", headers=OPERATOR)
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.text
    value: str = response.json()["status"]
    return value


async def settled_on(served: ServedWorker, saga_id: str, wanted: str) -> None:
    async def reached() -> bool:
        return await status(served, saga_id) == wanted

    await eventually(reached)


async def start(served: ServedWorker, customer: str = "c-1", **headers: str) -> str:
    response = await served.http.post(
        "/sagas/edge-checkout", json={"customer": customer}, headers={**OPERATOR, **headers}
    )
    assert response.status_code == 202, response.text
    saga_id: str = response.json()["saga_id"]
    return saga_id


async def produce(settings: Settings, topic: str, *envelopes: Envelope) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        for envelope in envelopes:
            key, value, headers = encode(envelope)
            await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()


async def topic_size(settings: Settings, topic: str) -> int:
    """How many records ``topic`` holds now (the sum of its partitions' end offsets):
    proves a record was NOT sent without waiting to see whether one arrives."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers, group_id=None)
    await consumer.start()
    try:
        partitions = await consumer._client.fetch_all_metadata()  # no public call for this
        tps = [TopicPartition(topic, p) for p in partitions.partitions_for_topic(topic) or ()]
        ends = await consumer.end_offsets(tps)
    finally:
        await consumer.stop()
    return sum(ends.values())


async def dead_letters(settings: Settings, count: int) -> list[dict[str, str]]:
    """The first ``count`` records of the dead-letter topic, as their headers (and value)."""
    records = await read_topic(settings.kafka, Topics.of(settings.kafka).dlq, count)
    assert len(records) == count, [dict(r.headers).get("dlq_reason") for r in records]
    out = []
    for record in records:
        headers = {k: bytes(v).decode(errors="replace") for k, v in record.headers}
        headers["value"] = bytes(record.value or b"").decode(errors="replace")
        out.append(headers)
    return out

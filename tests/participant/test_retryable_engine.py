"""``Retryable`` end to end, on the real Kafka and Postgres: an engine worker and a
participant kit in this process. The handler answers ``Retryable`` on its first call:
it runs exactly once for that attempt (no in-process handler retries), and the engine
retries the step under a new attempt and command id, which succeeds."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from pydantic import BaseModel

from saga_engine import RetryPolicy, Saga, SagaContext, SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.events import CommandIssued, ReplyReceived
from saga_engine.participant import Participant, Retryable, Transaction
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.participant.helpers import engine_settings
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class Trip(BaseModel):
    nights: int


class Booked(BaseModel):
    room: str


class Book(BaseModel):
    nights: int


class Booking(Saga[Trip, Booked]):
    name = "booking"

    async def run(self, ctx: SagaContext, input: Trip) -> Booked:
        return await ctx.step(
            "book",
            to="hotel",
            command=Book(nights=input.nights),
            returns=Booked,
            timeout=30,
            retry=RetryPolicy(max_attempts=3, initial_backoff=timedelta(milliseconds=50)),
        )


@pytest.fixture
async def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> AsyncIterator[Settings]:
    # handler_attempts above 1: a Retryable must not be retried in-process anyway.
    async with engine_settings(pg, kafka_bootstrap, unique_id, "hotel", handler_attempts=5) as s:
        yield s


async def test_a_retryable_answer_makes_the_engine_retry_the_step_under_a_new_attempt(
    settings: Settings,
) -> None:
    calls: Counter[str] = Counter()
    attempts: list[int] = []
    hotel = Participant("hotel", settings, backoff_base_s=0.01)

    @hotel.handles(Book)
    async def book(cmd: Book, tx: Transaction) -> Booked:
        calls[tx.command_id] += 1
        attempts.append(tx.attempt)
        if len(calls) == 1:
            raise Retryable("no rooms yet", after=timedelta(seconds=1))
        return Booked(room=f"{cmd.nights} nights")

    worker = SagaWorker(settings, [Booking])
    await worker.start()
    try:
        await hotel.start()
        async with SagaClient(settings) as client:
            saga_id = await client.start(Booking, Trip(nights=2))
        engine = worker.engine
        assert engine is not None

        async def completed() -> bool:
            try:
                return (await engine.get(saga_id)).status is SagaStatus.COMPLETED
            except Exception:
                return False  # not started yet

        await eventually(completed, timeout=60)
        history = await engine.history(saga_id)
    finally:
        await hotel.stop()
        await worker.stop()

    issued = [e for e in history if isinstance(e, CommandIssued)]
    replies = [e for e in history if isinstance(e, ReplyReceived)]
    assert [e.attempt for e in issued] == [1, 2]
    assert issued[0].command_id != issued[1].command_id
    assert [(r.command_id, r.outcome) for r in replies] == [
        (issued[0].command_id, "retryable"),
        (issued[1].command_id, "success"),
    ]
    assert replies[0].error == "no rooms yet (retry after 1s)"
    # Exactly once per attempt: each command id ran the handler once, as its first
    # in-process attempt.
    assert calls == Counter({issued[0].command_id: 1, issued[1].command_id: 1})
    assert attempts == [1, 1]
    assert hotel.stats["retryable"] == 1
    assert hotel.stats["handler_errors"] == 0

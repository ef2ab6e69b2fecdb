"""An operator re-sends a step waiting for its reply, on the real Kafka and Postgres: an
engine worker and a participant kit in this process. The participant is down when the
saga sends its command; the operator's retry sends it again under the same command id;
the participant, once up, gets both copies and applies the command once (its own table
counts one row), and the history records who re-sent it and why."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import asyncpg
import pytest

from saga_engine import InvalidTransition, Saga, SagaContext, SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.events import CommandIssued, RetryRequested
from saga_engine.participant import Participant, Transaction
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.participant.helpers import engine_settings
from tests.participant.test_retryable_engine import Book, Booked, Trip
from tests.waiting import eventually

pytestmark = pytest.mark.integration

DDL = "CREATE TABLE bookings (command_id text NOT NULL, nights int NOT NULL)"


class Booking(Saga[Trip, Booked]):
    name = "resent-booking"

    async def run(self, ctx: SagaContext, input: Trip) -> Booked:
        # A long timeout: nothing but the operator re-sends the command in this test.
        return await ctx.step(
            "book", to="hotel", command=Book(nights=input.nights), returns=Booked, timeout=3600
        )


@pytest.fixture
async def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> AsyncIterator[Settings]:
    async with engine_settings(pg, kafka_bootstrap, unique_id, "hotel", ddl=DDL) as s:
        yield s


async def test_an_operator_re_sends_a_step_and_the_participant_applies_it_once(
    settings: Settings,
) -> None:
    calls: Counter[str] = Counter()
    hotel = Participant("hotel", settings)

    @hotel.handles(Book)
    async def book(cmd: Book, tx: Transaction) -> Booked:
        calls[tx.command_id] += 1
        await tx.execute(
            "INSERT INTO bookings (command_id, nights) VALUES ($1, $2)", tx.command_id, cmd.nights
        )
        return Booked(room=f"{cmd.nights} nights")

    worker = SagaWorker(settings, [Booking])
    await worker.start()
    try:
        engine = worker.engine
        assert engine is not None
        async with SagaClient(settings) as client:
            saga_id = await client.start(Booking, Trip(nights=3))

        async def issued() -> bool:
            try:
                history = await engine.history(saga_id)
            except Exception:
                return False  # not started yet
            return any(isinstance(e, CommandIssued) for e in history)

        await eventually(issued, timeout=60)
        # Only a step the saga waits on can be re-sent; the error says what can.
        with pytest.raises(InvalidTransition, match=r"re-send one of \['book'\]"):
            await engine.retry_step(saga_id, "ship", principal="ops")
        await engine.retry_step(saga_id, "book", principal="ops", reason="hotel was down")
        await hotel.start()  # both copies wait in its topic

        async def completed() -> bool:
            return (await engine.get(saga_id)).status is SagaStatus.COMPLETED

        await eventually(completed, timeout=60)

        async def deduplicated() -> bool:  # the second copy reached it, and did nothing
            return hotel.stats["duplicates"] >= 1

        await eventually(deduplicated, timeout=30)
        history = await engine.history(saga_id)
    finally:
        await hotel.stop()
        await worker.stop()

    [command] = [e for e in history if isinstance(e, CommandIssued)]
    [resend] = [e for e in history if isinstance(e, RetryRequested)]
    assert (resend.step, resend.principal, resend.reason) == ("book", "ops", "hotel was down")
    assert calls == Counter({command.command_id: 1})
    assert settings.participant is not None
    conn = await asyncpg.connect(settings.participant.dsn.get_secret_value())
    try:
        rows = await conn.fetch(
            f'SELECT command_id FROM "{settings.participant.db_schema}".bookings'
        )
    finally:
        await conn.close()
    assert [r["command_id"] for r in rows] == [command.command_id]

"""The timing headers end to end, on the real Kafka and Postgres (PROTOCOL.md 7.4a): an
engine worker and a participant kit in this process. Each reply's timings are recorded
on its ``reply_received`` event, in order, and the type's insights show, for the step,
every phase of its time (held by flow control, to the participant, waiting, handler,
commit, back, apply, the handler's CPU) and its learned cost."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Settings
from saga_engine.admin import create_admin_app
from saga_engine.client import SagaClient
from saga_engine.events import ReplyReceived
from saga_engine.participant import Participant, Transaction
from saga_engine.settings import FlowLimit, LimitsSettings
from saga_engine.store import PostgresEventStore
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.participant.helpers import engine_settings
from tests.waiting import eventually

pytestmark = pytest.mark.integration

PHASES = ("held", "to_participant", "waiting", "handler", "commit", "back", "apply", "cpu")


class Trip(BaseModel):
    nights: int


class Booked(BaseModel):
    room: str


class Book(BaseModel):
    nights: int


class Booking(Saga[Trip, Booked]):
    name = "timed-booking"

    async def run(self, ctx: SagaContext, input: Trip) -> Booked:
        return await ctx.step(
            "book", to="hotel", command=Book(nights=input.nights), returns=Booked, timeout=60
        )


@pytest.fixture
async def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> AsyncIterator[Settings]:
    async with engine_settings(pg, kafka_bootstrap, unique_id, "hotel") as s:
        # One command at a time at the hotel: the sagas' commands queue behind each
        # other, so flow control holds some of them.
        yield s.model_copy(
            update={"limits": LimitsSettings(participants={"hotel": FlowLimit(concurrency=1)})}
        )


async def test_a_steps_time_is_recorded_and_shown_phase_by_phase(settings: Settings) -> None:
    hotel = Participant("hotel", settings)

    @hotel.handles(Book)
    async def book(cmd: Book, tx: Transaction) -> Booked:
        await tx.fetchval("SELECT 1")
        return Booked(room=f"{sum(range(10_000 * cmd.nights))}")

    worker = SagaWorker(settings, [Booking])
    await worker.start()
    try:
        await hotel.start()
        async with SagaClient(settings) as client:
            ids = [await client.start(Booking, Trip(nights=n)) for n in (1, 2, 3)]
        engine = worker.engine
        assert engine is not None

        async def completed() -> bool:
            try:
                return all([(await engine.get(i)).status is SagaStatus.COMPLETED for i in ids])
            except Exception:
                return False  # not started yet

        await eventually(completed, timeout=60)
        histories = [await engine.history(i) for i in ids]
        app = create_admin_app(engine, settings, parts=worker.parts)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as http:
            body = (await http.get("/saga-types/timed-booking/insights?window=1h")).json()
        store = worker.parts.store
        assert isinstance(store, PostgresEventStore)
        now = datetime.now(UTC)
        costs = await store.learned_costs(
            "timed-booking", now - timedelta(hours=1), now + timedelta(hours=1)
        )
    finally:
        await hotel.stop()
        await worker.stop()

    for history in histories:
        (reply,) = [e for e in history if isinstance(e, ReplyReceived)]
        t = reply.timings
        assert t is not None
        assert t.sent_at is not None
        assert t.received_at is not None
        assert t.handler_started_at is not None
        assert t.handler_ended_at is not None
        assert t.committed_at is not None
        assert t.handler_cpu_ms is not None
        # One clock, the participant's: in order.
        assert t.received_at <= t.handler_started_at <= t.handler_ended_at <= t.committed_at

    (node,) = body["nodes"]
    assert node["name"] == "book"
    assert sorted(node["timings_ms"]) == sorted(PHASES)
    assert {p["samples"] for p in node["timings_ms"].values()} == {3}
    assert all(p["mean_ms"] is not None for p in node["timings_ms"].values())
    cost = node["learned_cost"]
    assert cost is not None
    assert (cost["samples"], cost["cpu_samples"]) == (3, 3)
    assert cost["cpu_ms"] is not None
    assert costs["book"].samples == 3
    assert costs["book"].handler_ms == cost["handler_ms"]

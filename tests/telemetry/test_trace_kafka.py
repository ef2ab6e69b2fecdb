"""One saga across an in-process SagaWorker and two in-process Participants, on the real
Kafka and Postgres, makes ONE connected trace: saga span -> step spans -> handle spans."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel, SecretStr

from saga_engine import Saga, SagaContext, SagaStatus, Settings
from saga_engine._telemetry import Telemetry
from saga_engine._worker import SagaWorker
from saga_engine.participant import Participant, Transaction
from saga_engine.settings import (
    AdminSettings,
    EngineSettings,
    KafkaSettings,
    ParticipantSettings,
    PostgresSettings,
)
from tests.conftest import PgTarget

pytestmark = pytest.mark.integration


class Order(BaseModel):
    n: int = 1


class Done(BaseModel):
    ok: bool = True


class Reserve(BaseModel):
    n: int


class Release(BaseModel):
    n: int


class Charge(BaseModel):
    n: int


class Receipt(BaseModel):
    n: int


class Checkout(Saga[Order, Done]):
    name = "traced-checkout"

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        await ctx.step("reserve", to="stock", command=Reserve(n=input.n), compensate=Release(n=1))
        await ctx.step("charge", to="payments", command=Charge(n=input.n))
        return Done()


@pytest.fixture
def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> Settings:
    return Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=f"t{unique_id}",
            group_id=f"engines-{unique_id}",
            partitions=1,
        ),
        engine=EngineSettings(),
        admin=AdminSettings(enabled=False, port=0),
    )


@pytest.fixture
async def schemas(pg: PgTarget) -> AsyncIterator[list[str]]:
    """A schema of its own for each participant."""
    names = [f"{pg.schema}_stock", f"{pg.schema}_pay"]
    conn = await asyncpg.connect(pg.database_dsn)
    try:
        for name in names:
            await conn.execute(f'CREATE SCHEMA "{name}"')
    finally:
        await conn.close()
    yield names
    conn = await asyncpg.connect(pg.database_dsn)
    try:
        for name in names:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


def _participant(
    name: str, settings: Settings, schema: str, pg: PgTarget, telemetry: Telemetry
) -> Participant:
    own = settings.model_copy(
        update={
            "participant": ParticipantSettings(dsn=SecretStr(pg.database_dsn), db_schema=schema)
        }
    )
    return Participant(name, own, telemetry=telemetry, relay_interval_s=0.2)


async def test_one_saga_is_one_connected_trace_across_processes(
    settings: Settings, pg: PgTarget, schemas: list[str]
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(provider)

    stock = _participant("stock", settings, schemas[0], pg, telemetry)
    payments = _participant("payments", settings, schemas[1], pg, telemetry)

    @stock.handles(Reserve)
    async def reserve(cmd: Reserve, tx: Transaction) -> Receipt:
        return Receipt(n=cmd.n)

    @payments.handles(Charge)
    async def charge(cmd: Charge, tx: Transaction) -> Receipt:
        return Receipt(n=cmd.n)

    worker = SagaWorker(settings, [Checkout], telemetry=telemetry)
    await worker.start()
    try:
        async with stock, payments:
            assert worker.engine is not None
            saga_id = await worker.engine.start(Checkout, Order(), saga_id=str(uuid.uuid4()))
            record = await worker.engine.wait(saga_id, timeout=40)
            assert record.status is SagaStatus.COMPLETED
            spans = await _until(exporter, 5)
    finally:
        await worker.stop()

    by_name = {s.name: s for s in spans}
    assert set(by_name) == {
        "saga traced-checkout",
        "step reserve",
        "step charge",
        "handle Reserve",
        "handle Charge",
    }, [s.name for s in spans]
    root = by_name["saga traced-checkout"]
    assert root.parent is None
    assert root.context is not None
    trace_ids = {s.context.trace_id for s in spans if s.context is not None}
    assert trace_ids == {root.context.trace_id}

    def parent_of(name: str) -> int:
        parent = by_name[name].parent
        assert parent is not None, f"{name} has no parent"
        return int(parent.span_id)

    def span_id(name: str) -> int:
        context = by_name[name].context
        assert context is not None
        return int(context.span_id)

    assert parent_of("step reserve") == span_id("saga traced-checkout")
    assert parent_of("step charge") == span_id("saga traced-checkout")
    assert parent_of("handle Reserve") == span_id("step reserve")
    assert parent_of("handle Charge") == span_id("step charge")
    handle = by_name["handle Reserve"].attributes
    assert handle is not None
    assert handle["saga.id"] == saga_id
    assert handle["participant"] == "stock"


async def _until(exporter: InMemorySpanExporter, count: int) -> list[ReadableSpan]:
    """The participant's span ends after its reply is published: wait for it briefly."""
    for _ in range(100):
        spans = list(exporter.get_finished_spans())
        if len(spans) >= count:
            return spans
        await asyncio.sleep(0.05)
    return list(exporter.get_finished_spans())

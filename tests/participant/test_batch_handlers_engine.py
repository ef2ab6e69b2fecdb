"""Batch handlers end to end, on the real Kafka and Postgres: an engine worker and a
participant kit in this process. The participant's batch handlers refuse some of the
commands they are handed (returned ``Rejected``, nothing written for them): those sagas
compensate their earlier step, the others complete, and every effect is applied once."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.participant import CommandBatch, Participant, Rejected
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.participant.helpers import engine_settings, query
from tests.waiting import eventually

pytestmark = pytest.mark.integration

LEDGER = """
CREATE TABLE ledger (
    id bigserial PRIMARY KEY, command_id text NOT NULL, saga_id text NOT NULL,
    kind text NOT NULL, amount int NOT NULL
)
"""
INSERT = """
INSERT INTO ledger (command_id, saga_id, kind, amount)
SELECT c, s, $3, a FROM unnest($1::text[], $2::text[], $4::int[]) AS x(c, s, a)
"""


class Order(BaseModel):
    amount: int


class Hold(BaseModel):
    amount: int


class Unhold(BaseModel):
    amount: int


class Charge(BaseModel):
    amount: int


class Done(BaseModel):
    amount: int


class Checkout(Saga[Order, Done]):
    name = "batch-checkout"

    async def run(self, ctx: SagaContext, order: Order) -> Done:
        await ctx.step(
            "hold",
            to="shop",
            command=Hold(amount=order.amount),
            compensate=Unhold(amount=order.amount),
            timeout=30,
        )
        await ctx.step("charge", to="shop", command=Charge(amount=order.amount), timeout=30)
        return Done(amount=order.amount)


def shop(settings: Settings, sizes: list[int]) -> Participant:
    participant = Participant("shop", settings, backoff_base_s=0.01)

    async def write(batch: CommandBatch[Hold] | CommandBatch[Unhold], kind: str) -> None:
        await batch.execute(
            INSERT,
            [c.command_id for c in batch],
            [c.saga_id for c in batch],
            kind,
            [c.command.amount for c in batch],
        )

    @participant.handles_batch(Hold)
    async def hold(batch: CommandBatch[Hold]) -> list[None]:
        sizes.append(len(batch))
        await write(batch, "hold")
        return [None] * len(batch)

    @participant.handles_batch(Unhold)
    async def unhold(batch: CommandBatch[Unhold]) -> list[None]:
        await write(batch, "unhold")
        return [None] * len(batch)

    @participant.handles_batch(Charge)
    async def charge(batch: CommandBatch[Charge]) -> list[Rejected | None]:
        ok = [c for c in batch if c.command.amount <= 100]
        await batch.execute(
            INSERT,
            [c.command_id for c in ok],
            [c.saga_id for c in ok],
            "charge",
            [c.command.amount for c in ok],
        )
        return [None if c.command.amount <= 100 else Rejected("over the limit") for c in batch]

    return participant


@pytest.fixture
async def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> AsyncIterator[Settings]:
    async with engine_settings(pg, kafka_bootstrap, unique_id, "shop", ddl=LEDGER) as s:
        yield s


async def test_a_refused_command_compensates_its_saga_and_its_neighbours_complete(
    settings: Settings,
) -> None:
    amounts = [10, 500, 20, 600, 30]
    sizes: list[int] = []
    participant = shop(settings, sizes)
    worker = SagaWorker(settings, [Checkout])
    await worker.start()
    try:
        await participant.start()
        async with SagaClient(settings) as client:
            ids = [await client.start(Checkout, Order(amount=a)) for a in amounts]
        engine = worker.engine
        assert engine is not None

        async def statuses() -> dict[str, SagaStatus] | None:
            found = {}
            for saga_id in ids:
                try:
                    found[saga_id] = (await engine.get(saga_id)).status
                except Exception:
                    return None  # not started yet
            return found if all(s.is_terminal for s in found.values()) else None

        ended = await eventually(statuses, timeout=60)
    finally:
        await participant.stop()
        await worker.stop()

    want = {
        i: SagaStatus.COMPLETED if a <= 100 else SagaStatus.COMPENSATED
        for i, a in zip(ids, amounts, strict=True)
    }
    assert ended == want
    rows = await query(
        settings.participant.dsn.get_secret_value(),
        f'SELECT command_id, saga_id, kind FROM "{settings.participant.db_schema}".ledger',
    )
    assert len({r["command_id"] for r in rows}) == len(rows)  # each effect once
    for saga_id, status in want.items():
        kinds = sorted(r["kind"] for r in rows if r["saga_id"] == saga_id)
        expected = ["charge", "hold"] if status is SagaStatus.COMPLETED else ["hold", "unhold"]
        assert kinds == expected, (saga_id, status)
    assert sum(sizes) == len(amounts)  # every Hold went through the batch handler
    assert participant.stats["rejected"] == 2

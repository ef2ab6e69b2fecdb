"""``SagaClient.retry_step`` and ``.skip_step`` against a real worker (the real Postgres,
Kafka and admin API) and a participant over Kafka: a parked step retried with an edited
command (a wrong one refused first, nothing recorded), another skipped with a result (a
wrong one refused first), and the engine's refusals raised as the errors they are."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from saga_engine import (
    InvalidPayload,
    InvalidTransition,
    RetryPolicy,
    Saga,
    SagaContext,
    SagaNotFound,
    SagaStatus,
    Settings,
)
from saga_engine.client import SagaClient
from saga_engine.protocol import Envelope, ReplyBody
from tests.edge.conftest import OPERATOR, events, settled_on
from tests.integration.kafka_helpers import fake_participant
from tests.served_worker import OPERATOR_TOKEN, ServedWorker, served_worker

pytestmark = pytest.mark.integration


class Order(BaseModel):
    order_id: str
    address: str


class Ship(BaseModel):
    order_id: str
    address: str


class Shipped(BaseModel):
    tracking: str


class Done(BaseModel):
    tracking: str


class Shipping(Saga[Order, Done]):
    name = "client-shipping"

    async def run(self, ctx: SagaContext, order: Order) -> Done:
        shipped = await ctx.step(
            "ship",
            to="shipping",
            returns=Shipped,
            command=Ship(order_id=order.order_id, address=order.address),
            retry=RetryPolicy(
                max_attempts=1, initial_backoff=timedelta(seconds=1), on_exhausted="park"
            ),
        )
        return Done(tracking=shipped.tracking)


def _shipping(command: Envelope) -> ReplyBody:
    """Ships to any address but ``Nowhere``."""
    if command.body["address"] == "Nowhere":
        return ReplyBody(outcome="failure", error="unknown address")
    return ReplyBody(outcome="success", payload={"tracking": f"T-{command.body['order_id']}"})


async def _parked(served: ServedWorker, order_id: str) -> str:
    response = await served.http.post(
        "/sagas/client-shipping",
        json={"order_id": order_id, "address": "Nowhere"},
        headers=OPERATOR,
    )
    assert response.status_code == 202, response.text
    saga_id: str = response.json()["saga_id"]
    await settled_on(served, saga_id, "step_stuck")
    return saga_id


async def _output(served: ServedWorker, saga_id: str) -> Any:
    await settled_on(served, saga_id, "completed")
    return (await served.http.get(f"/sagas/{saga_id}", headers=OPERATOR)).json()["output"]


async def test_the_client_retries_a_parked_step_with_an_edited_command_and_skips_one(
    settings: Settings,
) -> None:
    async with (
        served_worker(settings, [Shipping]) as served,
        fake_participant(settings, "shipping", _shipping) as received,
        SagaClient(settings, admin_url=served.url, admin_token=OPERATOR_TOKEN) as client,
    ):
        saga_id = await _parked(served, "o-1")
        # A command the step's model refuses: the field named, nothing recorded.
        before = await events(served, saga_id)
        with pytest.raises(InvalidPayload) as wrong:
            await client.retry_step(saga_id, "ship", command={"order_id": "o-1"}, reason="fix")
        assert "address" in str(wrong.value.errors)
        assert await events(served, saga_id) == before
        status = await client.retry_step(
            saga_id,
            "ship",
            command=Ship(order_id="o-1", address="1 Main St"),
            reason="address corrected with the customer",
        )
        assert status in (SagaStatus.RUNNING, SagaStatus.COMPLETED)
        assert await _output(served, saga_id) == {"tracking": "T-o-1"}
        assert [c.body["address"] for c in received if c.saga_id == saga_id] == [
            "Nowhere",
            "1 Main St",
        ]
        [retried] = [e for e in await events(served, saga_id) if e["kind"] == "retry_requested"]
        assert retried["principal"] == "olivia"
        assert retried["reason"] == "address corrected with the customer"
        assert retried["command"] == {"order_id": "o-1", "address": "1 Main St"}
        # The saga has ended: its state refuses another retry.
        with pytest.raises(InvalidTransition):
            await client.retry_step(saga_id, "ship", reason="again")

        other = await _parked(served, "o-2")
        with pytest.raises(InvalidPayload) as wrong:
            await client.skip_step(other, "ship", {"tracking": 7}, reason="shipped by hand")
        assert "tracking" in str(wrong.value.errors)
        status = await client.skip_step(
            other, "ship", Shipped(tracking="BY-HAND"), reason="shipped by hand"
        )
        assert status in (SagaStatus.RUNNING, SagaStatus.COMPLETED)
        assert await _output(served, other) == {"tracking": "BY-HAND"}
        [skipped] = [e for e in await events(served, other) if e["kind"] == "step_skipped"]
        assert skipped["reason"] == "shipped by hand"
        assert [c.body["address"] for c in received if c.saga_id == other] == ["Nowhere"]

        with pytest.raises(SagaNotFound):
            await client.skip_step("no-such-saga", "ship", {"tracking": "x"}, reason="r")

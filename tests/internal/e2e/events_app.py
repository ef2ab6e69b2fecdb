"""The crash test's engine app for domain events (``saga worker
tests.internal.e2e.events_app``): a saga waits for the order's capture, then applies it
at the ``alpha`` ledger participant of ``app.py``, whose table counts the effects."""

from __future__ import annotations

import os
from datetime import timedelta

from pydantic import BaseModel

from saga_engine import EventSource, Saga, SagaContext
from tests.internal.e2e.app import Applied, Apply


class Order(BaseModel):
    order_id: int


class Captured(BaseModel):
    order_id: int
    amount: int


class Done(BaseModel):
    receipt: str


#: The topic is the test's own (its topic prefix, set in the engine's environment).
TOPIC = f"{os.environ.get('SAGA_KAFKA__TOPIC_PREFIX', 'saga')}.captured"

captured = EventSource(topic=TOPIC, model=Captured, key="order_id", retention=timedelta(hours=1))


class PayThenApply(Saga[Order, Done]):
    name = "pay-then-apply"

    async def run(self, ctx: SagaContext, order: Order) -> Done:
        paid = await ctx.wait_event(captured, key=order.order_id)
        applied = await ctx.step(
            "apply",
            to="alpha",
            command=Apply(amount=paid.amount),
            returns=Applied,
            timeout=timedelta(seconds=5),
        )
        return Done(receipt=applied.receipt)

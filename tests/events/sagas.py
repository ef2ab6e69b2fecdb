"""Sagas that wait for another service's domain events, shared by the tests of
``ctx.wait_event`` (the testing kit, the real servers, the SIGKILL test)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from saga_engine import EventSource, EventTimeout, Saga, SagaContext


class Order(BaseModel):
    order_id: int
    #: Seconds the wait lasts (0: no timeout).
    timeout_s: int = 0
    #: Waits for this many captures, one after another.
    captures: int = 1


class PaymentCaptured(BaseModel):
    order_id: int
    amount: int


class Ship(BaseModel):
    order_id: int
    amount: int


class Shipped(BaseModel):
    tracking: str = ""


class CheckoutResult(BaseModel):
    amounts: list[int]
    timed_out: bool = False


PAYMENTS_TOPIC = "test.payments.captured"

payment_captured = EventSource(
    topic=PAYMENTS_TOPIC, model=PaymentCaptured, key="order_id", retention=timedelta(hours=1)
)


class AwaitPayment(Saga[Order, CheckoutResult]):
    """Waits for the order's payment(s), then ships it (a step with an effect counted in
    the participant's own table in the crash test)."""

    name = "await-payment"

    async def run(self, ctx: SagaContext, order: Order) -> CheckoutResult:
        amounts: list[int] = []
        timeout = timedelta(seconds=order.timeout_s) if order.timeout_s else None
        for _ in range(order.captures):
            try:
                paid = await ctx.wait_event(PaymentCaptured, key=order.order_id, timeout=timeout)
            except EventTimeout:
                return CheckoutResult(amounts=amounts, timed_out=True)
            amounts.append(paid.amount)
        await ctx.step(
            "ship",
            to="shipping",
            command=Ship(order_id=order.order_id, amount=sum(amounts)),
            returns=Shipped,
            timeout=timedelta(seconds=10),
        )
        return CheckoutResult(amounts=amounts)

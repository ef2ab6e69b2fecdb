"""Sagas and messages shared by the tests (the README's PlaceOrder among them)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel

from saga_engine import RetryPolicy, Saga, SagaContext, Signal, StepFailed


class OrderRequest(BaseModel):
    customer: str
    total: int
    needs_approval: bool = False


class OrderResult(BaseModel):
    status: str
    stock_reservation: str = ""
    shipping_quote: int = 0


class ReserveCredit(BaseModel):
    customer: str
    amount: int


class ReleaseCredit(BaseModel):
    customer: str
    amount: int


class ReserveStock(BaseModel):
    order_total: int


class ReleaseStock(BaseModel):
    order_total: int


class StockReserved(BaseModel):
    reservation: str


class QuoteShipping(BaseModel):
    customer: str


class ShippingQuote(BaseModel):
    price: int


class Approval(BaseModel):
    approved: bool
    by: str


class PlaceOrder(Saga[OrderRequest, OrderResult]):
    name = "place-order"
    approval = Signal(Approval)

    async def run(self, ctx: SagaContext, order: OrderRequest) -> OrderResult:
        await ctx.step(
            "reserve-credit",
            to="payments",
            command=ReserveCredit(customer=order.customer, amount=order.total),
            compensate=ReleaseCredit(customer=order.customer, amount=order.total),
            retry=RetryPolicy(max_attempts=5),
            timeout=30,
        )
        stock, quote = await asyncio.gather(
            ctx.step(
                "reserve-stock",
                to="inventory",
                command=ReserveStock(order_total=order.total),
                compensate=ReleaseStock(order_total=order.total),
                returns=StockReserved,
            ),
            ctx.step(
                "quote-shipping",
                to="shipping",
                command=QuoteShipping(customer=order.customer),
                returns=ShippingQuote,
            ),
        )
        if order.needs_approval:
            decision = await ctx.wait_signal(self.approval, timeout=timedelta(hours=4))
            if not decision.approved:
                raise StepFailed("approval", f"rejected by {decision.by}")
        await ctx.sleep(timedelta(minutes=1))
        return OrderResult(
            status="confirmed", stock_reservation=stock.reservation, shipping_quote=quote.price
        )

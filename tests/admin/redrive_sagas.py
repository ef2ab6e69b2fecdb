"""A saga for the redrive and pivot tests of the admin API and the CLI: ``reserve``, then
``charge`` (the pivot, when asked), then ``ship``, which parks when it cannot succeed."""

from __future__ import annotations

from pydantic import BaseModel, Field

from saga_engine import RetryPolicy, Saga, SagaContext

PARK = RetryPolicy(max_attempts=1, on_exhausted="park")


class OrderIn(BaseModel):
    order: str = Field(min_length=1, max_length=50)
    amount: int = Field(gt=0, le=1_000_000)
    pivot: bool = False


class OrderOut(BaseModel):
    shipped_to: str


class Reserve(BaseModel):
    order: str


class Release(BaseModel):
    order: str


class Charge(BaseModel):
    order: str
    amount: int


class Ship(BaseModel):
    order: str
    address: str = Field(min_length=3)


class Shipped(BaseModel):
    to: str


class Order(Saga[OrderIn, OrderOut]):
    name = "order"

    async def run(self, ctx: SagaContext, o: OrderIn) -> OrderOut:
        await ctx.step(
            "reserve",
            to="stock",
            command=Reserve(order=o.order),
            compensate=Release(order=o.order),
        )
        await ctx.step(
            "charge",
            to="payments",
            command=Charge(order=o.order, amount=o.amount),
            pivot=o.pivot,
        )
        shipped = await ctx.step(
            "ship",
            to="shipping",
            command=Ship(order=o.order, address="nowhere"),
            returns=Shipped,
            retry=PARK,
        )
        return OrderOut(shipped_to=shipped.to)

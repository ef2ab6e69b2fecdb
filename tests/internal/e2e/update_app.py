"""A saga with updates and queries, for the crash test and the in-memory tests: a cart
that takes items (``add_item``, refused past its limit or once checked out) until it is
checked out (a signal), then charges its total on the "alpha" ledger participant.

    saga worker tests.internal.e2e.update_app:SAGAS
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from saga_engine import Saga, SagaContext, Signal, query, update
from tests.internal.e2e.app import Applied, Apply, Revert


class CartIn(BaseModel):
    customer: str
    limit: int = 1000


class Checkout(BaseModel):
    note: str = ""


class AddItem(BaseModel):
    sku: str
    price: int = Field(gt=0)


class Added(BaseModel):
    items: int
    total: int


class PriceWith(BaseModel):
    extra: int


class CartDone(BaseModel):
    items: list[str]
    total: int
    receipt: str


class Cart(Saga[CartIn, CartDone]):
    name = "cart"
    checkout = Signal(Checkout)

    def __init__(self) -> None:
        self.items: list[str] = []
        self.total = 0
        self.limit = 0
        self.checked_out = False

    async def run(self, ctx: SagaContext, cart: CartIn) -> CartDone:
        self.limit = cart.limit
        await ctx.wait_signal(self.checkout)
        self.checked_out = True
        reply = await ctx.step(
            "charge",
            to="alpha",
            command=Apply(amount=self.total),
            compensate=Revert(amount=self.total),
            timeout=5,
            returns=Applied,
        )
        return CartDone(items=self.items, total=self.total, receipt=reply.receipt)

    @update(AddItem)
    def add_item(self, item: AddItem) -> Added:
        if item.sku == "boom":
            raise ValueError("sku 'boom' is out of stock")
        self.items.append(item.sku)
        self.total += item.price
        return Added(items=len(self.items), total=self.total)

    @add_item.validator
    def _can_add(self, item: AddItem) -> str | None:
        if self.checked_out:
            return "the cart is checked out"
        if self.total + item.price > self.limit:
            return f"the cart's limit is {self.limit}"
        return None

    @update
    def clear(self) -> int:
        dropped, self.items, self.total = len(self.items), [], 0
        return dropped

    @query
    def summary(self) -> dict[str, Any]:
        return {"items": self.items, "total": self.total, "checked_out": self.checked_out}

    @query
    def average(self) -> float:
        return self.total / len(self.items)  # no items yet: it raises

    @query(PriceWith)
    def price_with(self, args: PriceWith) -> int:
        return self.total + args.extra


SAGAS = [Cart]

"""Sagas that report their progress (``ctx.emit``), for the progress tests."""

from __future__ import annotations

from pydantic import BaseModel

from saga_engine import Saga, SagaContext, Signal


class Status(BaseModel):
    stage: str


class Eta(BaseModel):
    minutes: int


class Reserve(BaseModel):
    sku: str = "sku-1"


class Release(BaseModel):
    sku: str = "sku-1"


class Order(BaseModel):
    order: str = "o-1"
    #: Wait for the ``go`` signal before the last stage (to follow a saga still open).
    hold: bool = False


class Done(BaseModel):
    items: int


class Tracked(Saga[Order, Done]):
    """Reports each stage on ``status`` and an estimate on ``eta``."""

    name = "tracked"
    go = Signal(Status)

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        await ctx.emit("status", Status(stage="reserving"))
        await ctx.step("reserve", to="stock", command=Reserve(), compensate=Release())
        await ctx.emit("eta", Eta(minutes=5))
        if input.hold:
            signalled = await ctx.wait_signal(self.go)
            await ctx.emit("status", Status(stage=signalled.stage))
        last = await ctx.emit("status", {"stage": "done"})
        return Done(items=last)

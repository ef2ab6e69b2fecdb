"""A saga that reports progress on every signal it takes, for the progress stream's
crash test: item 1 when it starts, then two items per ``tick`` (a ``status`` and an
``eta``), until it has taken ``count`` ticks.

    saga worker tests.internal.e2e.progress_app:SAGAS
"""

from __future__ import annotations

from pydantic import BaseModel

from saga_engine import Saga, SagaContext, Signal


class Ticks(BaseModel):
    count: int


class Tick(BaseModel):
    n: int


class Ticked(BaseModel):
    items: int


class Ticker(Saga[Ticks, Ticked]):
    name = "ticker"
    tick = Signal(Tick)

    async def run(self, ctx: SagaContext, input: Ticks) -> Ticked:
        last = await ctx.emit("status", {"stage": "started"})
        for taken in range(1, input.count + 1):
            tick = await ctx.wait_signal(self.tick)
            await ctx.emit("status", {"tick": tick.n})
            last = await ctx.emit("eta", {"left": input.count - taken})
        return Ticked(items=last)


SAGAS = [Ticker]

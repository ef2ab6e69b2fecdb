"""The crash tests' race (``saga worker tests.internal.e2e.race_app:SAGAS``) on the ledger
participants of ``app.py``, whose tables count the effects: a capture (alpha) races a
short durable timer; whichever wins, the saga then notifies (beta). A capture that loses
after its command was sent may have been applied: it is reverted once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from saga_engine import Saga, SagaContext
from tests.internal.e2e.app import Applied, Apply, Revert

#: So long that nothing but a recovering engine sends a command again.
TIMEOUT_S = 3600


class RaceOrder(BaseModel):
    amount: int
    #: How long the capture has before the timer wins.
    window_s: float = 1.0


class RaceDone(BaseModel):
    outcome: str


class RaceTransfer(Saga[RaceOrder, RaceDone]):
    name = "race-transfer"

    async def run(self, ctx: SagaContext, order: RaceOrder) -> RaceDone:
        won = await ctx.first(
            captured=ctx.step(
                "capture",
                to="alpha",
                command=Apply(amount=order.amount),
                compensate=Revert(amount=order.amount),
                timeout=TIMEOUT_S,
                returns=Applied,
            ),
            expired=ctx.sleep(timedelta(seconds=order.window_s)),
        )
        await ctx.step("notify", to="beta", command=Apply(amount=0), timeout=TIMEOUT_S)
        return RaceDone(outcome=won.name)


SAGAS: list[type[Saga[Any, Any]]] = [RaceTransfer]

"""A saga with one step on the "alpha" ledger participant and a long timeout, for the
re-send crash test: nothing but an operator (or a recovering engine) sends its command
again.

    saga worker tests.internal.e2e.resend_app:SAGAS
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from saga_engine import Saga, SagaContext
from tests.internal.e2e.app import Applied, Apply, Revert


class Charge(BaseModel):
    amount: int


class Charged(BaseModel):
    receipt: str


class Resent(Saga[Charge, Charged]):
    name = "resent"

    async def run(self, ctx: SagaContext, charge: Charge) -> Charged:
        reply = await ctx.step(
            "charge",
            to="alpha",
            command=Apply(amount=charge.amount),
            compensate=Revert(amount=charge.amount),
            timeout=3600,
            returns=Applied,
        )
        return Charged(receipt=reply.receipt)


SAGAS: list[type[Saga[Any, Any]]] = [Resent]

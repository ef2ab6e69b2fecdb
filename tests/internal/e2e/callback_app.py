"""The crash tests' callback saga (``saga worker tests.internal.e2e.callback_app:SAGAS``):
an HTTP step to a KYC vendor that answers 202 and posts its verdict later to the URL in
the ``Saga-Callback-Url`` header, then a step to the ledger participant beta (``app.py``),
whose table counts the effect."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from saga_engine import Saga, SagaContext
from tests.internal.e2e.app import Apply

#: So long that nothing but a recovering engine sends a command again.
TIMEOUT_S = 3600


class KycOrder(BaseModel):
    order: str


class KycVerdict(BaseModel):
    approved: bool
    score: int


class KycDone(BaseModel):
    approved: bool
    score: int


class KycCheck(Saga[KycOrder, KycDone]):
    name = "kyc-check"

    async def run(self, ctx: SagaContext, order: KycOrder) -> KycDone:
        verdict = await ctx.http_step(
            "kyc",
            endpoint="vendor",
            path="/checks",
            json={"order": order.order},
            returns=KycVerdict,
            completion="callback",
            callback_timeout=timedelta(hours=1),
        )
        await ctx.step("notify", to="beta", command=Apply(amount=verdict.score), timeout=TIMEOUT_S)
        return KycDone(approved=verdict.approved, score=verdict.score)


SAGAS: list[type[Saga[Any, Any]]] = [KycCheck]

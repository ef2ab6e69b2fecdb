"""Two versions of one saga type, for the SIGKILL-during-a-rollout test: an engine process
runs ``saga worker tests.internal.versions.app``; the participants are the crash tests'
ledger participants (tests/internal/e2e/app.py).

Version 1 applies at alpha and beta; version 2 at alpha, beta and gamma. So the
participants' ledgers tell which class drove a saga: a gamma row only for version 2.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from saga_engine import Saga, SagaContext
from tests.internal.e2e.app import Applied, Apply, Revert

TYPE = "versioned-transfer"


class Request(BaseModel):
    amount: int
    pause_s: float = 0.0  # a durable sleep between the steps, to keep sagas in flight


class Done(BaseModel):
    version: int
    receipts: list[str]


async def _apply(ctx: SagaContext, req: Request, participants: tuple[str, ...]) -> list[str]:
    receipts: list[str] = []
    for i, participant in enumerate(participants):
        if i and req.pause_s:
            await ctx.sleep(timedelta(seconds=req.pause_s))
        reply = await ctx.step(
            f"apply-{participant}",
            to=participant,
            command=Apply(amount=req.amount),
            compensate=Revert(amount=req.amount),
            timeout=5,
            returns=Applied,
        )
        receipts.append(reply.receipt)
    return receipts


class TransferV1(Saga[Request, Done]):
    name = TYPE

    async def run(self, ctx: SagaContext, req: Request) -> Done:
        return Done(version=1, receipts=await _apply(ctx, req, ("alpha", "beta")))


class TransferV2(Saga[Request, Done]):
    name = TYPE
    version = 2

    async def run(self, ctx: SagaContext, req: Request) -> Done:
        return Done(version=2, receipts=await _apply(ctx, req, ("alpha", "beta", "gamma")))

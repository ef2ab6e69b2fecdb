"""The application of the redrive and pivot crash tests (``test_redrive.py``): two sagas
over the three ledger participants of ``app.py`` (each records its effects in its own
schema's ``ledger``, a duplicate shows as a second row).

- ``pivoted``: alpha, then beta as the pivot, then gamma, which refuses when asked to. Past
  the pivot the refusal parks the saga (whatever gamma's policy says).
- ``parking``: alpha, then beta, whose policy parks the saga when beta refuses.

    saga worker tests.internal.e2e.redrive_app    # an engine process
"""

from __future__ import annotations

from pydantic import BaseModel

from saga_engine import RetryPolicy, Saga, SagaContext
from tests.internal.e2e.app import Applied, Apply, Revert


class RedriveRequest(BaseModel):
    amount: int
    refuse: str | None = None  # the participant that refuses its step


class RedriveDone(BaseModel):
    receipts: list[str]


class Pivoted(Saga[RedriveRequest, RedriveDone]):
    name = "pivoted"

    async def run(self, ctx: SagaContext, req: RedriveRequest) -> RedriveDone:
        receipts = []
        for participant in ("alpha", "beta", "gamma"):
            reply = await ctx.step(
                f"apply-{participant}",
                to=participant,
                command=Apply(amount=req.amount, refuse=req.refuse == participant),
                compensate=Revert(amount=req.amount),
                timeout=5,
                returns=Applied,
                pivot=participant == "beta",
            )
            receipts.append(reply.receipt)
        return RedriveDone(receipts=receipts)


class Parking(Saga[RedriveRequest, RedriveDone]):
    name = "parking"

    async def run(self, ctx: SagaContext, req: RedriveRequest) -> RedriveDone:
        receipts = []
        for participant in ("alpha", "beta"):
            reply = await ctx.step(
                f"apply-{participant}",
                to=participant,
                command=Apply(amount=req.amount, refuse=req.refuse == participant),
                compensate=Revert(amount=req.amount),
                timeout=5,
                returns=Applied,
                retry=RetryPolicy(max_attempts=2, on_exhausted="park"),
            )
            receipts.append(reply.receipt)
        return RedriveDone(receipts=receipts)

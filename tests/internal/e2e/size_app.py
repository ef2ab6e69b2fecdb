"""The end-to-end application of ``app`` plus a saga whose second step's command is as
large as its input asks (``test_oversized``): the participants are ``app``'s.

    saga worker tests.internal.e2e.size_app:SAGAS
"""

from __future__ import annotations

from pydantic import BaseModel

from saga_engine import Saga, SagaContext
from tests.internal.e2e.app import Applied, Apply, Payout, Revert, Transfer


class BulkyRequest(BaseModel):
    #: Characters in the second step's command.
    size: int


class BulkyApply(BaseModel):
    amount: int
    blob: str


class BulkyDone(BaseModel):
    pass


class Bulky(Saga[BulkyRequest, BulkyDone]):
    """A first step that is applied, then a step whose command is ``size`` characters:
    too large for the broker, it fails and the first step is compensated."""

    name = "bulky"

    async def run(self, ctx: SagaContext, req: BulkyRequest) -> BulkyDone:
        await ctx.step(
            "apply-alpha",
            to="alpha",
            command=Apply(amount=1),
            compensate=Revert(amount=1),
            timeout=5,
            returns=Applied,
        )
        await ctx.step(
            "apply-beta",
            to="beta",
            command=BulkyApply(amount=1, blob="x" * req.size),
            timeout=5,
            returns=Applied,
        )
        return BulkyDone()


class Lost(Saga[BulkyRequest, BulkyDone]):
    """A step to a participant whose command topic cannot exist (its name is not a
    topic name): every send of it fails, transiently as far as the engine can tell."""

    name = "lost"

    async def run(self, ctx: SagaContext, req: BulkyRequest) -> BulkyDone:
        await ctx.step("nowhere", to="no such topic!", command=Apply(amount=req.size), timeout=1)
        return BulkyDone()


SAGAS = [Bulky, Lost, Transfer, Payout]

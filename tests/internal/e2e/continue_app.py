"""The crash tests' looping saga (``saga worker tests.internal.e2e.continue_app:SAGAS``) on
the ledger participants of ``app.py``, whose tables count the effects: each run applies
one step at alpha under the same step name, then continues as new; the last run closes at
beta, which may refuse (then every run's step is reverted, last first)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from saga_engine import Saga, SagaContext
from tests.internal.e2e.app import Applied, Apply, Revert

#: So long that nothing but a recovering engine sends a command again.
TIMEOUT_S = 3600


class LoopRequest(BaseModel):
    n: int = 0
    until: int = 3
    #: beta refuses the closing step: the saga compensates every run's step.
    refuse_close: bool = False


class LoopDone(BaseModel):
    runs: int


class Looper(Saga[LoopRequest, LoopDone]):
    name = "looper"

    async def run(self, ctx: SagaContext, req: LoopRequest) -> LoopDone:
        await ctx.step(
            "apply",
            to="alpha",
            command=Apply(amount=req.n),
            compensate=Revert(amount=req.n),
            timeout=TIMEOUT_S,
            returns=Applied,
        )
        if req.n + 1 < req.until:
            return await ctx.continue_as_new(req.model_copy(update={"n": req.n + 1}))
        await ctx.step(
            "close",
            to="beta",
            command=Apply(amount=0, refuse=req.refuse_close),
            timeout=TIMEOUT_S,
        )
        return LoopDone(runs=req.n + 1)


SAGAS: list[type[Saga[Any, Any]]] = [Looper]

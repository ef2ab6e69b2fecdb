"""Sagas the property tests drive, with a static description of their steps for the oracles.

Each saga keeps its steps in a table (:class:`StepSpec`), so the oracles know, without
asking the runtime, which steps carry a compensation and how many attempts each gets.
The "broken" variants share the original's name, as a redeploy with changed code would:
one changes the first step's payload, one renames a later step. Every step declares its
reply model (``returns=Ack``), so a success reply the model refuses is held; the
"lenient" variants are a fixed deploy whose model (``LenientAck``) accepts any reply
the world sends.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from saga_engine import RetryPolicy, Saga, SagaContext, Signal, StepFailed
from saga_engine.core.authoring._definition import SagaDefinition


class In(BaseModel):
    amount: int = 10


class Out(BaseModel):
    done: list[str] = Field(default_factory=list)


class Cmd(BaseModel):
    step: str
    amount: int


class Undo(BaseModel):
    step: str
    amount: int


class Ack(BaseModel):
    """What a participant answers a step with: the world's replies are ``{"outcome": ...}``."""

    outcome: str


class LenientAck(BaseModel):
    """The reply model of a fixed deploy: it reads whatever ``outcome`` came (or none)."""

    outcome: Any = None


@dataclass(frozen=True)
class StepSpec:
    name: str
    compensate: bool
    attempts: int
    timeout_s: float | None
    compensate_attempts: int = 2
    #: It parks (``on_exhausted="park"``) rather than raising when it cannot succeed.
    park: bool = False
    #: The saga's pivot step.
    pivot: bool = False


def policy(attempts: int, park: bool = False) -> RetryPolicy:
    return RetryPolicy(
        max_attempts=attempts,
        initial_backoff=timedelta(seconds=1),
        max_backoff=timedelta(seconds=4),
        on_exhausted="park" if park else "compensate",
    )


def table(*specs: StepSpec) -> dict[str, StepSpec]:
    return {spec.name: spec for spec in specs}


class PropertySaga(Saga[In, Out]):
    """Base of the test sagas (no ``name``, so it is not a saga itself)."""

    steps: ClassVar[dict[str, StepSpec]]
    #: Broken variants: added to the first step's amount (changes its payload).
    tweak_first: ClassVar[int] = 0
    #: Broken variants: step name -> the name the changed code uses.
    renamed: ClassVar[dict[str, str]] = {}
    #: Every step's reply model; a fixed deploy reads more.
    reply_model: ClassVar[type[BaseModel]] = Ack

    async def do(self, ctx: SagaContext, step: str, amount: int) -> str:
        spec = self.steps[step]
        name = self.renamed.get(step, step)
        await ctx.step(
            name,
            to=f"svc-{step}",
            command=Cmd(step=step, amount=amount),
            compensate=Undo(step=step, amount=amount) if spec.compensate else None,
            retry=policy(spec.attempts, spec.park),
            timeout=spec.timeout_s,
            compensate_retry=policy(spec.compensate_attempts),
            returns=self.reply_model,
            pivot=spec.pivot,
        )
        return name


class SequentialSaga(PropertySaga):
    """Four steps in a row (one without compensation) and a durable sleep."""

    name = "prop-sequential"
    steps = table(
        StepSpec("reserve", compensate=True, attempts=2, timeout_s=30, compensate_attempts=2),
        StepSpec("notify", compensate=False, attempts=3, timeout_s=30),
        # No timeout: neither the step nor its compensation can time out.
        StepSpec("charge", compensate=True, attempts=1, timeout_s=None, compensate_attempts=1),
        StepSpec("ship", compensate=True, attempts=2, timeout_s=10, compensate_attempts=3),
    )

    async def run(self, ctx: SagaContext, input: In) -> Out:
        done = [await self.do(ctx, "reserve", input.amount + self.tweak_first)]
        done.append(await self.do(ctx, "notify", input.amount))
        await ctx.sleep(timedelta(seconds=5))
        done.append(await self.do(ctx, "charge", input.amount))
        done.append(await self.do(ctx, "ship", input.amount))
        return Out(done=done)


class GatherSaga(PropertySaga):
    """A step, three parallel steps (asyncio.gather), a last step."""

    name = "prop-gather"
    steps = table(
        StepSpec("first", compensate=True, attempts=2, timeout_s=20, compensate_attempts=2),
        StepSpec("p1", compensate=True, attempts=2, timeout_s=15, compensate_attempts=2),
        StepSpec("p2", compensate=False, attempts=2, timeout_s=15),
        StepSpec("p3", compensate=True, attempts=3, timeout_s=15, compensate_attempts=1),
        StepSpec("last", compensate=True, attempts=1, timeout_s=10, compensate_attempts=2),
    )

    async def run(self, ctx: SagaContext, input: In) -> Out:
        done = [await self.do(ctx, "first", input.amount + self.tweak_first)]
        done += await asyncio.gather(
            self.do(ctx, "p1", input.amount),
            self.do(ctx, "p2", input.amount),
            self.do(ctx, "p3", input.amount),
        )
        done.append(await self.do(ctx, "last", input.amount))
        return Out(done=done)


class CatchingSaga(PropertySaga):
    """Catches a failed optional step, runs a fallback instead and carries on."""

    name = "prop-catching"
    steps = table(
        StepSpec("hold", compensate=True, attempts=2, timeout_s=10, compensate_attempts=2),
        StepSpec("optional", compensate=True, attempts=2, timeout_s=10, compensate_attempts=2),
        StepSpec("fallback", compensate=False, attempts=1, timeout_s=10),
        StepSpec("final", compensate=True, attempts=2, timeout_s=10, compensate_attempts=1),
    )

    async def run(self, ctx: SagaContext, input: In) -> Out:
        done = [await self.do(ctx, "hold", input.amount + self.tweak_first)]
        try:
            done.append(await self.do(ctx, "optional", input.amount))
        except StepFailed:
            done.append(await self.do(ctx, "fallback", input.amount))
        done.append(await self.do(ctx, "final", input.amount))
        return Out(done=done)


class Go(BaseModel):
    ok: bool = True


class SignalSaga(PropertySaga):
    """A step, a wait for a signal with a deadline, a sleep, a wait without one, a step."""

    name = "prop-signals"
    confirm = Signal(Go, name="confirm")
    release = Signal(Go, name="release")
    steps = table(
        StepSpec("hold", compensate=True, attempts=2, timeout_s=10, compensate_attempts=2),
        StepSpec("settle", compensate=True, attempts=2, timeout_s=10, compensate_attempts=1),
    )

    async def run(self, ctx: SagaContext, input: In) -> Out:
        done = [await self.do(ctx, "hold", input.amount + self.tweak_first)]
        await ctx.wait_signal(self.confirm, timeout=timedelta(seconds=30))
        await ctx.sleep(timedelta(seconds=2))
        await ctx.wait_signal(self.release)
        done.append(await self.do(ctx, "settle", input.amount))
        return Out(done=done)


class ParkSaga(PropertySaga):
    """Steps in a row, all but one of which park when they cannot succeed (no pivot)."""

    name = "prop-park"
    steps = table(
        StepSpec("reserve", compensate=True, attempts=2, timeout_s=10, park=True),
        StepSpec("hold", compensate=True, attempts=1, timeout_s=10, park=True),
        StepSpec("charge", compensate=True, attempts=1, timeout_s=10),
        StepSpec("notify", compensate=False, attempts=1, timeout_s=10, park=True),
        StepSpec("ship", compensate=True, attempts=2, timeout_s=10, park=True),
    )

    async def run(self, ctx: SagaContext, input: In) -> Out:
        return Out(done=[await self.do(ctx, step, input.amount) for step in self.steps])


class PivotSaga(ParkSaga):
    """Parking steps before a pivot (which carries a compensation, owed while its
    outcome is unknown), then steps past it that park whatever their policy."""

    name = "prop-pivot"
    steps = table(
        StepSpec("reserve", compensate=True, attempts=2, timeout_s=10, park=True),
        StepSpec("hold", compensate=True, attempts=1, timeout_s=10, park=True),
        StepSpec("capture", compensate=True, attempts=2, timeout_s=10, pivot=True),
        StepSpec("ship", compensate=True, attempts=2, timeout_s=10),
        StepSpec("notify", compensate=False, attempts=1, timeout_s=10, park=True),
    )


# --------------------------------------------------------------------------- changed code


class SequentialPayloadChanged(SequentialSaga):
    name = "prop-sequential"
    tweak_first = 1


class SequentialRenamed(SequentialSaga):
    name = "prop-sequential"
    renamed = {"charge": "charge-v2"}


class GatherPayloadChanged(GatherSaga):
    name = "prop-gather"
    tweak_first = 1


class GatherRenamed(GatherSaga):
    name = "prop-gather"
    renamed = {"p3": "p3-v2"}


class CatchingPayloadChanged(CatchingSaga):
    name = "prop-catching"
    tweak_first = 1


class CatchingRenamed(CatchingSaga):
    name = "prop-catching"
    renamed = {"fallback": "fallback-v2"}


# --------------------------------------------------------------------------- fixed code


class SequentialLenient(SequentialSaga):
    name = "prop-sequential"
    reply_model = LenientAck


class GatherLenient(GatherSaga):
    name = "prop-gather"
    reply_model = LenientAck


class CatchingLenient(CatchingSaga):
    name = "prop-catching"
    reply_model = LenientAck


_DEFINITIONS: dict[str, SagaDefinition] = {}


def definition(saga: type[PropertySaga]) -> SagaDefinition:
    """``SagaDefinition.of`` builds JSON schemas; once per class is enough."""
    key = saga.__qualname__
    if key not in _DEFINITIONS:
        _DEFINITIONS[key] = SagaDefinition.of(saga)
    return _DEFINITIONS[key]


@dataclass(frozen=True)
class Case:
    saga: type[PropertySaga]
    #: Changes the first step's payload: every history is nondeterministic under it.
    payload_changed: type[PropertySaga]
    #: Renames ``renamed_step``: nondeterministic exactly when a history reached that step.
    renamed: type[PropertySaga]
    renamed_step: str
    #: The same code with a reply model that reads every reply: a fix for held replies.
    lenient: type[PropertySaga]

    @property
    def id(self) -> str:
        return self.saga.name


CASES = [
    Case(SequentialSaga, SequentialPayloadChanged, SequentialRenamed, "charge", SequentialLenient),
    Case(GatherSaga, GatherPayloadChanged, GatherRenamed, "p3", GatherLenient),
    Case(CatchingSaga, CatchingPayloadChanged, CatchingRenamed, "fallback", CatchingLenient),
]

"""The one saga shape every workload runs: three steps on participant ``p``, each with a
compensation. Half the sagas complete (``Completes``); the other half (``Fails``) send
their third step to participant ``q``, which refuses it (the command carries
``fail=True``), so the saga undoes its first two steps, last first.

The decision core answers a command as a participant would (:func:`outcome`); the
testing kit scripts ``q`` to refuse; the participant kit's handler raises ``Rejected``
when ``fail`` is set."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel

from saga_engine import Saga, SagaContext
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import Decision, OutboundCommand, Reply, StartSaga
from saga_engine.core.runtime._runtime import SagaRuntime

#: A fixed instant: the workloads do not read the clock.
AT = datetime(2026, 1, 1, tzinfo=UTC)
STEPS = ("a", "b", "c")


class Order(BaseModel):
    n: int


class Placed(BaseModel):
    ok: bool = True


class Do(BaseModel):
    n: int
    fail: bool = False


class Undo(BaseModel):
    n: int


class Completes(Saga[Order, Placed]):
    name = "ir-completes"

    async def run(self, ctx: SagaContext, order: Order) -> Placed:
        for step in STEPS:
            await ctx.step(step, to="p", command=Do(n=order.n), compensate=Undo(n=order.n))
        return Placed()


class Fails(Saga[Order, Placed]):
    name = "ir-fails"

    async def run(self, ctx: SagaContext, order: Order) -> Placed:
        for step in STEPS[:-1]:
            await ctx.step(step, to="p", command=Do(n=order.n), compensate=Undo(n=order.n))
        await ctx.step(STEPS[-1], to="q", command=Do(n=order.n, fail=True))
        return Placed()


SAGAS: tuple[type[Saga[Order, Placed]], ...] = (Completes, Fails)


def saga_of(k: int) -> type[Saga[Order, Placed]]:
    """The k-th saga's class: even ones complete, odd ones fail at their third step."""
    return SAGAS[k % 2]


def definitions() -> tuple[SagaDefinition, ...]:
    return tuple(SagaDefinition.of(s) for s in SAGAS)


def outcome(command: OutboundCommand) -> Literal["success", "failure"]:
    """What a participant answers: a refusal of a command that carries ``fail``."""
    return "failure" if command.payload.get("fail") else "success"


def reply_to(command: OutboundCommand) -> Reply:
    result = outcome(command)
    return Reply(command.command_id, result, AT, error="refused" if result == "failure" else None)


def saga_id(k: int) -> str:
    return str(uuid.UUID(int=k + 1))


def started(definition: SagaDefinition, k: int) -> tuple[SagaRuntime, Decision]:
    """The k-th saga started in the decision core."""
    start = StartSaga(saga_id=saga_id(k), saga_type=definition.name, input={"n": k}, at=AT)
    return SagaRuntime.start(definition, start)


def waves(n: int, batch: int) -> Iterator[list[OutboundCommand]]:
    """The commands of ``n`` sagas as an engine with ``batch`` of them in flight sends
    them: ``batch`` sagas started together, then each round of their commands (every
    first step, every second...; the compensations last) as one wave, answered by
    :func:`outcome` before the next."""
    defs = definitions()
    for first in range(0, n, batch):
        runtimes: dict[str, SagaRuntime] = {}
        wave: list[OutboundCommand] = []
        for k in range(first, min(n, first + batch)):
            runtime, decision = started(defs[k % 2], k)
            runtimes[saga_id(k)] = runtime
            wave.extend(decision.commands)
        while wave:
            yield wave
            following: list[OutboundCommand] = []
            for command in wave:
                following.extend(runtimes[command.saga_id].handle(reply_to(command)).commands)
            wave = following
        for runtime in runtimes.values():
            runtime.close()

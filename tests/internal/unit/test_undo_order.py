"""The one undo rule (core/runtime/_undo): its plan, and a history recorded before it."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._events import (
    CompensationIssued,
    CompensationSpec,
    CompensationStarted,
)
from saga_engine.core.history._policy import DEFAULT_COMPENSATION_RETRY
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.runtime._state import OwedCompensation
from saga_engine.core.runtime._undo import undo_plan
from saga_engine.testing import SagaTestEnv


class In(BaseModel):
    pass


class Out(BaseModel):
    pass


class Do(BaseModel):
    what: str


class Undo(BaseModel):
    what: str


class Branches(Saga[In, Out]):
    name = "branches"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        async def one(name: str) -> None:
            await ctx.step(name, to="p", command=Do(what=name), compensate=Undo(what=name))

        await asyncio.gather(one("left"), one("right"))
        await ctx.step("last", to="q", command=Do(what="last"))
        return Out()


def owed(
    step: str, began: int, owed_at: int, after: frozenset[str] | None = None
) -> OwedCompensation:
    spec = CompensationSpec(
        participant="p", command_type="Undo", payload={}, retry=DEFAULT_COMPENSATION_RETRY
    )
    return OwedCompensation(step, spec, (), began, owed_at, after)


def test_steps_that_overlapped_wait_for_none_of_each_other() -> None:
    # a: 1..2, then b and c overlap (3..5, 4..6), then d (7..8): last owed first.
    stack = [owed("d", 7, 8), owed("c", 4, 6), owed("b", 3, 5), owed("a", 1, 2)]
    assert undo_plan(stack, {}) == {"d": [], "c": ["d"], "b": ["d"], "a": ["c", "b"]}


def test_declared_dependencies_order_the_undo_whatever_order_the_steps_ran_in() -> None:
    # b ran after a finished, but the graph says they are independent: parallel.
    declared = {"a": frozenset(), "b": frozenset(), "c": frozenset({"x"}), "x": frozenset({"a"})}
    stack = [
        owed("c", 5, 6, declared["c"]),
        owed("b", 3, 4, declared["b"]),
        owed("a", 1, 2, declared["a"]),
    ]
    # c depends on a through x (which owes nothing): undone before a.
    assert undo_plan(stack, declared) == {"c": [], "b": [], "a": ["c"]}


async def test_a_history_recorded_before_the_plan_is_undone_one_at_a_time() -> None:
    env = SagaTestEnv([Branches])
    env.participant("p").on(Do, reply={}).on(Undo, reply={})
    env.participant("q").on(Do, reject="no")
    env.hold(lambda c: c.compensation)
    run = await env.start(Branches, In())
    await env.settle()
    history = await run.history()
    started = next(i for i, e in enumerate(history) if isinstance(e, CompensationStarted))
    definition = SagaDefinition.of(Branches)

    # As recorded today: both compensations are owed at once.
    _, decision = SagaRuntime.replay(definition, run.saga_id, history[: started + 1])
    assert sorted(c.step for c in decision.commands if c.compensation) == ["left", "right"]

    # As an older engine recorded it (no plan): one at a time, in owed's order.
    plan = history[started]
    assert isinstance(plan, CompensationStarted)
    old = plan.model_copy(update={"after": None})
    runtime, decision = SagaRuntime.replay(definition, run.saga_id, [*history[:started], old])
    issued = [e for e in decision.events if isinstance(e, CompensationIssued)]
    assert [e.step for e in issued] == [old.owed[0]]
    assert runtime.status == SagaStatus.COMPENSATING

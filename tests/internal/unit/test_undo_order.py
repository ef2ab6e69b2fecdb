"""The one undo rule (core/runtime/_undo): its plan, and a history recorded before it."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._events import (
    CompensationIssued,
    CompensationSpec,
    CompensationStarted,
)
from saga_engine.core.history._policy import DEFAULT_COMPENSATION_RETRY
from saga_engine.core.history._structs import replace
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.runtime._state import OwedCompensation
from saga_engine.core.runtime._undo import undo_plan
from saga_engine.core.views._view import saga_view_of
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
    old = replace(plan, after=None)
    runtime, decision = SagaRuntime.replay(definition, run.saga_id, [*history[:started], old])
    issued = [e for e in decision.events if isinstance(e, CompensationIssued)]
    assert [e.step for e in issued] == [old.owed[0]]
    assert runtime.status == SagaStatus.COMPENSATING


class Undone(Saga[In, Out]):
    """first; then two branches at once; then a refused step: the branches are undone in
    parallel, and both their compensations refused (stuck at once)."""

    name = "undone"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        async def one(name: str, to: str) -> None:
            await ctx.step(name, to=to, command=Do(what=name), compensate=Undo(what=name))

        await one("first", "p")
        await asyncio.gather(one("left", "l"), one("right", "r"))
        await ctx.step("last", to="q", command=Do(what="last"))
        return Out()


async def test_two_stuck_compensations_are_each_answered_on_their_own() -> None:
    env = SagaTestEnv([Undone])
    for name in ("p", "l", "r"):
        env.participant(name).on(Do, reply={}).on(Undo, reply={})
    env.participant("q").on(Do, reject="no")
    env.participant("l").on(Undo, reject="ledger locked")
    env.participant("r").on(Undo, reject="ledger locked")
    run = await env.start(Undone, In())
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATION_STUCK
    view = saga_view_of(await run.history(), saga_id=run.saga_id)
    for _ in range(50):  # the other one may still be in its back-off: its timers fire
        if len(view.stuck_steps) == 2:
            break
        await env.advance(timedelta(minutes=10))
        view = saga_view_of(await run.history(), saga_id=run.saga_id)
    assert sorted(view.stuck_steps) == ["left", "right"]
    assert {w.step for w in view.waiting_for if w.compensation} == {"left", "right"}
    # The second stuck one is answered first: skipped by hand; the other stays stuck.
    second = view.stuck_steps[1]
    await env.engine.skip_step(run.saga_id, second, reason="undone by hand")
    await env.settle()
    view = saga_view_of(await run.history(), saga_id=run.saga_id)
    assert view.status == SagaStatus.COMPENSATION_STUCK
    assert view.stuck_steps == (view.stuck_steps[0],) != (second,)
    assert env.compensated_steps().count("first") == 0  # still waits for both branches
    # The other is retried once its participant is back: then first, and the end.
    other = view.stuck_steps[0]
    env.participant(other[0]).on(Undo, reply={})
    await env.engine.retry_step(run.saga_id, other, reason="ledger unlocked")
    await env.settle()
    assert await run.status() == SagaStatus.COMPENSATED
    history: list[Any] = await run.history()
    done = [e.step for e in history if e.kind == "compensation_completed"]
    assert done == [other, "first"]
    runtime, _ = SagaRuntime.replay(SagaDefinition.of(Undone), run.saga_id, history)
    assert runtime.status == SagaStatus.COMPENSATED

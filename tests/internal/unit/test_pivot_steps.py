"""§6 beyond ``ctx.step``: an HTTP step and a child saga as the pivot, and what a parent's
compensation does to a child past its own pivot (it refuses the undo: the parent's
compensation is stuck at the child, and nothing before it is compensated)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel

from saga_engine import PastPivot, Saga, SagaContext, SagaStatus
from saga_engine.core.history._decision import CHILD_PARTICIPANT, child_saga_id
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.views._view import saga_view_of
from saga_engine.testing import SagaTestEnv


class Cmd(BaseModel):
    n: int


class Undo(BaseModel):
    n: int


class In(BaseModel):
    n: int = 1
    #: Ask the child to be this saga's pivot (``ctx.child(..., pivot=True)``).
    child_pivot: bool = False


class Out(BaseModel):
    got: list[str] = []


class HttpPivot(Saga[In, Out]):
    """reserve, then the HTTP pivot capture, then ship (default policy: compensate)."""

    name = "http-pivot"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await ctx.step("reserve", to="stock", command=Cmd(n=input.n), compensate=Undo(n=1))
        await ctx.http_step("capture", endpoint="payments", path="/capture", pivot=True)
        await ctx.step("ship", to="shipping", command=Cmd(n=input.n), compensate=Undo(n=3))
        return Out(got=["reserve", "capture", "ship"])


class Child(Saga[In, Out]):
    """book (compensatable), then its own pivot capture, then label."""

    name = "pivot-child"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await ctx.step("book", to="carrier", command=Cmd(n=input.n), compensate=Undo(n=1))
        await ctx.step("capture", to="payments", command=Cmd(n=input.n), pivot=True)
        await ctx.step("label", to="printer", command=Cmd(n=input.n))
        return Out(got=["book", "capture", "label"])


class Parent(Saga[In, Out]):
    """reserve, the child (the parent's pivot if asked), then charge."""

    name = "pivot-parent"

    async def run(self, ctx: SagaContext, input: In) -> Out:
        await ctx.step("reserve", to="stock", command=Cmd(n=input.n), compensate=Undo(n=1))
        await ctx.child(Child, In(n=input.n), pivot=input.child_pivot)
        await ctx.step("charge", to="billing", command=Cmd(n=input.n), compensate=Undo(n=3))
        return Out(got=["reserve", "child", "charge"])


def _env(*sagas: type[Saga[In, Out]]) -> SagaTestEnv:
    env = SagaTestEnv(list(sagas))
    for name in ("stock", "shipping", "carrier", "payments", "printer", "billing"):
        env.participant(name).on(Cmd, reply={})
    env.participant("http:payments").on("HttpRequest", reply={"captured": True})
    return env


async def _replays_cleanly(env: SagaTestEnv, saga_id: str, saga_type: str) -> None:
    definition = env.parts.registry.get(saga_type)
    runtime, decision = SagaRuntime.replay(definition, saga_id, await env.engine.history(saga_id))
    assert decision.nondeterminism is None
    assert decision.events == []
    runtime.close()


async def _refuses_stops(env: SagaTestEnv, saga_id: str) -> None:
    before = len(await env.engine.history(saga_id))
    with pytest.raises(PastPivot, match="past its pivot"):
        await env.engine.cancel(saga_id, "too late")
    with pytest.raises(PastPivot, match="past its pivot"):
        await env.engine.force_compensate(saga_id, "too late")
    assert len(await env.engine.history(saga_id)) == before


async def test_an_http_pivot_refuses_a_cancel_lifts_the_deadline_and_parks_a_later_step() -> None:
    env = _env(HttpPivot)
    env.participant("shipping").on(Cmd, reject="warehouse closed", times=1)
    run = await env.start(HttpPivot, In(), deadline=timedelta(minutes=1))
    assert await env.run_until_settled(run) == SagaStatus.STEP_STUCK
    history = await run.history()
    passed = [e for e in history if e.kind == "pivot_passed"]
    assert [e.step for e in passed] == ["capture"]
    parked = next(e for e in history if e.kind == "step_parked")
    assert (parked.step, parked.past_pivot) == ("ship", True)
    view = saga_view_of(history, saga_id=run.saga_id)
    assert (view.pivot_step, view.past_pivot) == ("capture", True)
    await _refuses_stops(env, run.saga_id)
    await env.advance(timedelta(minutes=5))  # well past the deadline: still parked
    assert await run.status() == SagaStatus.STEP_STUCK
    await env.engine.retry_step(run.saga_id, "ship", reason="warehouse reopened")
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    assert env.compensated_steps() == []
    await _replays_cleanly(env, run.saga_id, "http-pivot")


async def test_before_an_http_pivot_succeeds_a_cancel_compensates_it_too() -> None:
    env = _env(HttpPivot)
    env.participant("http:payments").reset().on("HttpRequest", no_reply=True)
    run = await env.start(HttpPivot, In())
    await env.cancel(run)
    assert await env.run_until_settled(run) == SagaStatus.CANCELLED
    assert env.compensated_steps() == ["reserve"]  # capture has no compensation


async def test_a_child_as_the_pivot_makes_its_parent_go_forward() -> None:
    env = _env(Parent, Child)
    env.participant("billing").on(Cmd, reject="card declined", times=1)
    run = await env.start(Parent, In(child_pivot=True))
    assert await env.run_until_settled(run) == SagaStatus.STEP_STUCK
    history = await run.history()
    assert [e.step for e in history if e.kind == "pivot_passed"] == ["child:pivot-child"]
    parked = next(e for e in history if e.kind == "step_parked")
    assert (parked.step, parked.past_pivot) == ("charge", True)
    await _refuses_stops(env, run.saga_id)
    await env.engine.retry_step(run.saga_id, "charge")
    assert await env.run_until_settled(run) == SagaStatus.COMPLETED
    assert env.compensated_steps() == []
    await _replays_cleanly(env, run.saga_id, "pivot-parent")


async def test_a_completed_child_past_its_pivot_refuses_its_parents_undo() -> None:
    env = _env(Parent, Child)
    env.participant("billing").on(Cmd, reject="card declined")
    run = await env.start(Parent, In())
    # charge refused: the parent compensates, newest first: the child refuses its undo
    # (each retry too), so the parent is stuck there and the reservation is kept.
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATION_STUCK
    child_id = child_saga_id(run.saga_id, "pivot-child")
    assert (await env.engine.get(child_id)).status == SagaStatus.COMPLETED
    child_kinds = [e.kind for e in await env.engine.history(child_id)]
    assert "undo_requested" not in child_kinds
    assert "compensation_started" not in child_kinds
    assert env.compensated_steps() == ["child:pivot-child"]
    assert len(env.commands(CHILD_PARTICIPANT, compensation=True)) > 1  # retried, refused
    stuck = next(e for e in await run.history() if e.kind == "compensation_stuck")
    assert stuck.step == "child:pivot-child"
    assert "past its pivot" in stuck.error.message
    # An operator who undid the child's effects by hand skips its compensation: the
    # parent goes on with the rest of its stack.
    await env.engine.skip_step(run.saga_id, "child:pivot-child", reason="refunded by hand")
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATED
    assert env.compensated_steps() == ["child:pivot-child", "reserve"]
    assert (await env.engine.get(child_id)).status == SagaStatus.COMPLETED
    await _replays_cleanly(env, run.saga_id, "pivot-parent")
    await _replays_cleanly(env, child_id, "pivot-child")


async def test_a_running_child_past_its_pivot_is_not_cancelled_with_its_parent() -> None:
    env = _env(Parent, Child)
    env.participant("printer").on(Cmd, reject="out of paper", times=1)
    run = await env.start(Parent, In())
    child_id = child_saga_id(run.saga_id, "pivot-child")
    await env.settle()
    assert (await env.engine.get(child_id)).status == SagaStatus.STEP_STUCK  # label parked
    await env.cancel(run)  # the parent is not past a pivot: its cancel is accepted
    assert await env.run_until_settled(run) == SagaStatus.COMPENSATION_STUCK
    assert (await env.engine.get(child_id)).status == SagaStatus.STEP_STUCK
    assert "undo_requested" not in [e.kind for e in await env.engine.history(child_id)]
    assert "carrier" not in {c.participant for c in env.commands(compensation=True)}
    # The child goes forward when its step is retried.
    await env.engine.retry_step(child_id, "label")
    await env.settle()
    assert (await env.engine.get(child_id)).status == SagaStatus.COMPLETED


async def test_a_child_before_its_pivot_is_undone_as_usual() -> None:
    env = _env(Parent, Child)
    env.participant("payments").on(Cmd, no_reply=True)  # the child's pivot never answers
    run = await env.start(Parent, In())
    child_id = child_saga_id(run.saga_id, "pivot-child")
    await env.cancel(run)
    assert await env.run_until_settled(run) == SagaStatus.CANCELLED
    assert (await env.engine.get(child_id)).status == SagaStatus.CANCELLED
    # The capture was in flight (its outcome unknown) but carries no compensation.
    assert env.compensated_steps() == ["child:pivot-child", "book", "reserve"]

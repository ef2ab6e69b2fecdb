"""Races and timeout scopes through the public API (issue 41, section 1): ``ctx.first``
over every kind of ctx operation, ``ctx.timeout`` and its nesting, the steps a saga's code
gives up (compensated at once when they may have been applied, exactly once), and the
clear errors of misuse."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

import pytest
from pydantic import BaseModel

from saga_engine import (
    InvalidTransition,
    RetryPolicy,
    Saga,
    SagaContext,
    SagaStatus,
    SagaTimeout,
    Signal,
    StepFailed,
    UpdateFailed,
    Winner,
    update,
)
from saga_engine.events import Event, StepAbandoned
from saga_engine.replay import HistoryExport, replay
from saga_engine.testing import SagaTestEnv


class Empty(BaseModel):
    pass


class Charge(BaseModel):
    amount: int = 5


class Refund(BaseModel):
    amount: int = 5


class Hold(BaseModel):
    pass


class Release(BaseModel):
    pass


class Out(BaseModel):
    outcome: str = ""


def kinds(history: Sequence[Event], step: str) -> list[str]:
    return [e.kind for e in history if getattr(e, "step", None) == step]


# --------------------------------------------------------------------------- ctx.timeout


class Scoped(Saga[Empty, Out]):
    """A hold, then a charge that must answer within five minutes, else a fallback."""

    name = "scoped"

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        await ctx.step("hold", to="stock", command=Hold(), compensate=Release())
        try:
            async with ctx.timeout(timedelta(minutes=5)):
                await ctx.step("charge", to="payments", command=Charge(), compensate=Refund())
        except SagaTimeout as timeout:
            return Out(outcome=f"timed out ({timeout.scope})")
        return Out(outcome="charged")


async def test_a_block_that_finishes_first_drops_its_timer() -> None:
    env = SagaTestEnv([Scoped])
    run = await env.start(Scoped, Empty())
    assert await run.status() == SagaStatus.COMPLETED
    assert (await run.output()).outcome == "charged"  # type: ignore[attr-defined]
    await env.advance(timedelta(minutes=10))  # its timer, if armed still, would be stale
    assert env.commands(compensation=True) == []


async def test_a_timer_that_fires_first_raises_saga_timeout_and_refunds_the_step() -> None:
    env = SagaTestEnv([Scoped])
    env.participant("payments").on(Charge, no_reply=True)
    run = await env.start(Scoped, Empty())
    await env.advance(timedelta(minutes=6))
    assert await run.status() == SagaStatus.COMPLETED
    assert (await run.output()).outcome == "timed out (scope:1)"  # type: ignore[attr-defined]
    history = await run.history()
    # The charge was sent and may have been applied: given up, refunded once; the hold,
    # before the block, is not the block's and stays.
    assert kinds(history, "charge") == [
        "command_issued",
        "step_abandoned",
        "compensation_issued",
        "reply_received",
        "compensation_completed",
    ]
    abandoned = next(e for e in history if isinstance(e, StepAbandoned))
    assert abandoned.in_doubt
    assert "ctx.timeout(0:05:00) expired" in abandoned.reason
    assert env.compensated_steps() == ["charge"]
    # Its late reply is dropped: the refund stands, nothing is sent again.
    charge = env.commands("payments", compensation=False)[0]
    await env.engine.reply(run.saga_id, charge.command_id, "success", {})
    assert len(env.commands(compensation=True)) == 1


class Nested(Saga[Empty, Out]):
    """An inner scope of a minute inside an outer one of ten."""

    name = "nested"
    go = Signal(Empty)

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        seen = []
        try:
            async with ctx.timeout(timedelta(minutes=10)):
                try:
                    async with ctx.timeout(timedelta(minutes=1)):
                        await ctx.wait_signal(self.go)
                except SagaTimeout as inner:
                    seen.append(f"inner {inner.scope}")
                await ctx.step("charge", to="payments", command=Charge(), compensate=Refund())
        except SagaTimeout as outer:
            seen.append(f"outer {outer.scope}")
        return Out(outcome=", ".join(seen))


async def test_nested_scopes_each_raise_for_their_own_timer() -> None:
    env = SagaTestEnv([Nested])
    env.participant("payments").on(Charge, no_reply=True)
    run = await env.start(Nested, Empty())
    await env.advance(timedelta(minutes=2))  # the inner one fired: caught inside the outer
    assert await run.status() == SagaStatus.RUNNING
    await env.advance(timedelta(minutes=9))  # the outer one fired: it gives the charge up
    assert await run.status() == SagaStatus.COMPLETED
    assert (await run.output()).outcome == "inner scope:2, outer scope:1"  # type: ignore[attr-defined]
    assert env.compensated_steps() == ["charge"]


async def test_blocks_that_finish_in_time_raise_nothing() -> None:
    env = SagaTestEnv([Nested])
    run = await env.start(Nested, Empty())
    await env.signal(run, "go", Empty())  # the inner block ends; the charge answers at once
    assert (await run.output()).outcome == ""  # type: ignore[attr-defined]
    await env.advance(timedelta(hours=1))  # both timers, had they been armed, are stale
    assert env.compensated_steps() == []


class InnerLonger(Saga[Empty, Out]):
    name = "inner-longer"
    go = Signal(Empty)

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        try:
            async with ctx.timeout(timedelta(minutes=1)):
                try:
                    async with ctx.timeout(timedelta(hours=1)):
                        await ctx.wait_signal(self.go)
                except SagaTimeout:
                    return Out(outcome="the inner one claimed it")
        except SagaTimeout as outer:
            return Out(outcome=f"outer {outer.scope}")
        return Out(outcome="signalled")


async def test_the_outer_scope_bounds_a_longer_inner_one() -> None:
    env = SagaTestEnv([InnerLonger])
    run = await env.start(InnerLonger, Empty())
    await env.advance(timedelta(minutes=2))
    assert (await run.output()).outcome == "outer scope:1"  # type: ignore[attr-defined]


class Uncaught(Saga[Empty, Out]):
    name = "uncaught-timeout"

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        await ctx.step("hold", to="stock", command=Hold(), compensate=Release())
        async with ctx.timeout(timedelta(minutes=5)):
            await ctx.step("charge", to="payments", command=Charge(), compensate=Refund())
        return Out()


async def test_an_uncaught_saga_timeout_compensates_the_saga() -> None:
    env = SagaTestEnv([Uncaught])
    env.participant("payments").on(Charge, no_reply=True)
    run = await env.start(Uncaught, Empty())
    await env.advance(timedelta(minutes=6))
    assert await run.status() == SagaStatus.COMPENSATED
    error = await run.error()
    assert error is not None
    assert error["type"] == "SagaTimeout"
    # The given-up charge is undone first, then the stack (the hold): each once.
    assert env.compensated_steps() == ["charge", "hold"]
    assert len(env.commands(compensation=True)) == 2


# --------------------------------------------------------------------------- ctx.first


class Child(Saga[Empty, Out]):
    name = "race-child"

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        await ctx.step("book", to="carrier", command=Hold(), compensate=Release())
        await ctx.sleep(timedelta(hours=1))
        return Out(outcome="booked")


class ChildRace(Saga[Empty, Out]):
    """A child saga races a cancel signal."""

    name = "child-race"
    cancel = Signal(Empty)

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        won = await ctx.first(
            shipped=ctx.child(Child, Empty()), cancelled=ctx.wait_signal(self.cancel)
        )
        return Out(outcome=won.name)


async def test_a_child_that_loses_is_cancelled_and_undoes_itself() -> None:
    env = SagaTestEnv([ChildRace, Child])
    run = await env.start(ChildRace, Empty())
    await env.signal(run, "cancel", Empty())
    assert await run.status() == SagaStatus.COMPLETED
    assert (await run.output()).outcome == "cancelled"  # type: ignore[attr-defined]
    child_id = next(c for c in env.commands() if c.step == "child:race-child").payload["saga_id"]
    child = await env.engine.get(child_id)
    assert child.status == SagaStatus.CANCELLED
    # The parent undid the child (its undo answered), the child its booking: once each.
    assert env.compensated_steps() == ["child:race-child", "book"]


async def test_a_child_that_wins_is_kept() -> None:
    env = SagaTestEnv([ChildRace, Child])
    run = await env.start(ChildRace, Empty())
    await env.advance(timedelta(hours=2))
    assert (await run.output()).outcome == "shipped"  # type: ignore[attr-defined]
    assert env.compensated_steps() == []


class Failing(Saga[Empty, Out]):
    """A hold, a race the charge loses, then a step that fails."""

    name = "race-then-fail"
    go = Signal(Empty)

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        await ctx.step("hold", to="stock", command=Hold(), compensate=Release())
        await ctx.first(
            charged=ctx.step("charge", to="payments", command=Charge(), compensate=Refund()),
            go=ctx.wait_signal(self.go),
        )
        await ctx.step("ship", to="shipping", command=Hold())
        return Out()


async def test_a_failure_after_a_race_undoes_the_given_up_step_first_and_once() -> None:
    env = SagaTestEnv([Failing])
    env.participant("payments").on(Charge, no_reply=True)
    env.participant("payments").on(Refund, no_reply=True, times=1)  # its first attempt hangs
    env.participant("shipping").on(Hold, reject="no route")
    run = await env.start(Failing, Empty())
    await env.signal(run, "go", Empty())
    assert await run.status() == SagaStatus.COMPENSATING
    # The hold waits for the refund, still under way (a step given up came after it).
    assert env.compensated_steps() == ["charge"]
    await env.advance(timedelta(minutes=5))  # the refund's attempt times out, is re-sent
    assert await run.status() == SagaStatus.COMPENSATED
    assert env.compensated_steps() == ["charge", "hold"]
    history = await run.history()
    started = next(e for e in history if e.kind == "compensation_started")
    assert started.owed == ["hold"]
    assert kinds(history, "charge").count("compensation_completed") == 1


class Winning(Saga[Empty, Out]):
    name = "winner-raises"
    go = Signal(Empty)

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        try:
            await ctx.first(
                charged=ctx.step("charge", to="payments", command=Charge(), compensate=Refund()),
                held=ctx.step("hold", to="stock", command=Hold(), compensate=Release()),
            )
        except StepFailed as failed:
            return Out(outcome=f"{failed.step} failed")
        return Out(outcome="won")


async def test_a_winner_that_raises_raises_from_first_after_the_losers_are_given_up() -> None:
    env = SagaTestEnv([Winning])
    env.participant("payments").on(Charge, reject="card declined")
    env.participant("stock").on(Hold, no_reply=True)
    run = await env.start(Winning, Empty())
    assert (await run.output()).outcome == "charge failed"  # type: ignore[attr-defined]
    # The hold lost while in flight: released once. The refused charge owes nothing.
    assert env.compensated_steps() == ["hold"]


class LeftRunning(Saga[Empty, Out]):
    """``asyncio.wait(FIRST_COMPLETED)``, the loser left running when ``run`` returns."""

    name = "left-running"
    go = Signal(Empty)

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        charge = asyncio.ensure_future(
            ctx.step("charge", to="payments", command=Charge(), compensate=Refund())
        )
        go = asyncio.ensure_future(ctx.wait_signal(self.go))
        await asyncio.wait({charge, go}, return_when=asyncio.FIRST_COMPLETED)
        return Out(outcome="go" if go.done() else "charged")


async def test_a_loser_left_running_when_run_returns_is_given_up_and_refunded() -> None:
    env = SagaTestEnv([LeftRunning])
    env.participant("payments").on(Charge, no_reply=True)
    env.participant("payments").on(Refund, no_reply=True, times=1)
    run = await env.start(LeftRunning, Empty())
    await env.signal(run, "go", Empty())
    # The run returned; the saga completes once the charge it left is refunded.
    assert await run.status() == SagaStatus.RUNNING
    with pytest.raises(InvalidTransition, match="run has ended"):
        await env.cancel(run)
    await env.advance(timedelta(minutes=1))
    assert await run.status() == SagaStatus.COMPLETED
    assert (await run.output()).outcome == "go"  # type: ignore[attr-defined]
    history = await run.history()
    abandoned = next(e for e in history if isinstance(e, StepAbandoned))
    assert abandoned.reason == "the run returned without it"
    assert kinds(history, "charge").count("compensation_completed") == 1


class StuckUndo(Saga[Empty, Out]):
    """A charge loses to a signal (its refund may get stuck); the run goes on."""

    name = "stuck-undo"
    go = Signal(Empty)
    close = Signal(Empty)

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        won = await ctx.first(
            charged=ctx.step(
                "charge",
                to="payments",
                command=Charge(),
                compensate=Refund(),
                compensate_retry=RetryPolicy(max_attempts=2),
            ),
            go=ctx.wait_signal(self.go),
        )
        await ctx.step("ship", to="shipping", command=Hold(), compensate=Release())
        await ctx.wait_signal(self.close)
        return Out(outcome=won.name)


@pytest.mark.parametrize("answer", ["retry", "skip"])
async def test_a_stuck_undo_of_a_given_up_step_waits_for_an_operator(answer: str) -> None:
    env = SagaTestEnv([StuckUndo])
    env.participant("payments").on(Charge, no_reply=True)
    env.participant("payments").on(Refund, reject="ledger closed", times=2)
    run = await env.start(StuckUndo, Empty())
    await env.signal(run, "go", Empty())
    await env.advance(timedelta(minutes=1))
    # The run goes on (the ship step is done); the saga waits for an operator.
    assert await run.status() == SagaStatus.STEP_STUCK
    error = await run.error()
    assert error is not None
    assert error["type"] == "CompensationStuck"
    with pytest.raises(InvalidTransition, match="which its code gave up, is stuck"):
        await env.resume(run)
    if answer == "retry":
        await env.engine.retry_step(run.saga_id, "charge")
    else:
        await env.engine.skip_step(run.saga_id, "charge")
    await env.settle()
    assert await run.status() == SagaStatus.RUNNING
    await env.signal(run, "close", Empty())
    assert await run.status() == SagaStatus.COMPLETED
    assert (await run.output()).outcome == "go"  # type: ignore[attr-defined]
    refunds = len(env.commands("payments", compensation=True))
    assert refunds == (3 if answer == "retry" else 2)


# --------------------------------------------------------------------------- misuse


class Case(BaseModel):
    case: str


class Misuse(Saga[Case, Out]):
    """Each case a bug a saga's author may write."""

    name = "misuse"

    async def run(self, ctx: SagaContext, input: Case) -> Out:
        match input.case:
            case "nothing":
                await ctx.first()
            case "a value":
                await ctx.first(a=5)  # type: ignore[arg-type]
            case "a task":
                await ctx.first(a=asyncio.ensure_future(ctx.sleep(1)))
            case "twice":
                sleep = ctx.sleep(1)
                await ctx.first(a=sleep, b=sleep)
            case "mine":
                await ctx.first(a=self.mine(ctx))
            case "sync with":
                with ctx.timeout(5):  # type: ignore[attr-defined]
                    pass
            case "entered twice":
                scope = ctx.timeout(5)
                async with scope:
                    pass
                async with scope:
                    pass
            case "wait_for":
                await asyncio.wait_for(ctx.sleep(1), 5)
            case "asyncio.timeout":
                async with asyncio.timeout(5):
                    await ctx.sleep(1)
            case "wait with a timeout":
                await asyncio.wait([asyncio.ensure_future(ctx.sleep(1))], timeout=5)
            case "unknown update":
                await ctx.first(a=ctx.wait_update("no-such-update"))
        return Out()

    async def mine(self, ctx: SagaContext) -> None:
        await ctx.sleep(timedelta(seconds=1))


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("nothing", "ctx.first needs something to race"),
        ("a value", "ctx.first(a=...) got 5 (not awaitable)"),
        ("a task", "not a value, a task or a future"),
        ("twice", "already awaited (or raced twice)"),
        ("mine", "Misuse.mine, which is not a ctx operation"),
        ("sync with", "`async with ctx.timeout(...):`"),
        ("entered twice", "a ctx.timeout(...) scope is entered once"),
        ("wait_for", "`async with ctx.timeout(delay):`"),
        ("asyncio.timeout", "ctx.first(done=..., expired=ctx.sleep(delay))"),
        ("wait with a timeout", "asyncio.wait with a timeout"),
        ("unknown update", "waits for update 'no-such-update' but declares no such @update"),
    ],
)
async def test_misuse_parks_the_saga_with_a_clear_error(case: str, message: str) -> None:
    env = SagaTestEnv([Misuse])
    run = await env.start(Misuse, Case(case=case))
    # A bug in the code parks the saga (nothing is compensated), saying what to write.
    assert await run.status() == SagaStatus.NONDETERMINISTIC
    error = await run.error()
    assert error is not None
    assert error["type"] == "DefinitionError"
    assert message in error["message"]
    assert env.commands(compensation=True) == []


class QuotesPastPivot(Saga[Empty, Out]):
    """A pivot, then two quotes race: the slower one is released even past the pivot."""

    name = "race-past-pivot"

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        await ctx.step("capture", to="payments", command=Charge(), pivot=True)
        won = await ctx.first(
            fast=ctx.step("quote-a", to="carrier-a", command=Hold(), compensate=Release()),
            slow=ctx.step("quote-b", to="carrier-b", command=Hold(), compensate=Release()),
        )
        return Out(outcome=won.name)


async def test_past_its_pivot_a_saga_still_undoes_the_step_it_gave_up() -> None:
    env = SagaTestEnv([QuotesPastPivot])
    env.participant("carrier-b").on(Hold, no_reply=True)
    run = await env.start(QuotesPastPivot, Empty())
    assert (await run.output()).outcome == "fast"  # type: ignore[attr-defined]
    # quote-b was sent and may have been applied: released, although no cancel or
    # failure could undo anything of this saga any more.
    assert env.compensated_steps() == ["quote-b"]


async def test_a_run_that_fails_with_nothing_owed_ends_once_its_loser_is_undone() -> None:
    env = SagaTestEnv([StuckUndo])
    env.participant("payments").on(Charge, no_reply=True)
    env.participant("payments").on(Refund, no_reply=True, times=1)
    env.participant("shipping").on(Hold, reject="no route")
    run = await env.start(StuckUndo, Empty())
    await env.signal(run, "go", Empty())
    # The ship step was refused; nothing is on the stack, but the charge's refund runs.
    assert await run.status() == SagaStatus.RUNNING
    with pytest.raises(InvalidTransition, match="run has ended"):
        await env.cancel(run)
    await env.advance(timedelta(minutes=1))  # the refund's attempt timed out, sent again
    assert await run.status() == SagaStatus.FAILED
    assert kinds(await run.history(), "charge").count("compensation_completed") == 1


class Address(BaseModel):
    street: str


class Delivery(Saga[Empty, Out]):
    """Waits up to a day for the customer to give an address (an update), else ships to
    the pick-up point."""

    name = "delivery"

    def __init__(self) -> None:
        self.address = ""

    async def run(self, ctx: SagaContext, input: Empty) -> Out:
        won = await ctx.first(
            given=ctx.wait_update(Delivery.set_address), expired=ctx.sleep(timedelta(days=1))
        )
        match won:
            case Winner("given", Address() as address):
                return Out(outcome=f"to {address.street} ({self.address})")
            case _:
                return Out(outcome="to the pick-up point")

    @update(Address)
    def set_address(self, address: Address) -> str:
        if not address.street:
            raise ValueError("an empty street")
        self.address = address.street
        return "noted"


async def test_an_update_can_win_a_race_once_its_handler_accepted_it() -> None:
    env = SagaTestEnv([Delivery])
    run = await env.start(Delivery, Empty())
    # An update whose handler raises is recorded (its caller gets the error): no winner.
    with pytest.raises(UpdateFailed):
        await env.update(run, Delivery.set_address, Address(street=""))
    assert await run.status() == SagaStatus.RUNNING
    assert await env.update(run, Delivery.set_address, Address(street="Main St 1")) == "noted"
    assert (await run.output()).outcome == "to Main St 1 (Main St 1)"  # type: ignore[attr-defined]
    history = await run.history()
    assert replay([Delivery], HistoryExport(run.saga_id, Delivery.name, history)).deterministic

    late = await env.start(Delivery, Empty())
    await env.advance(timedelta(days=1, minutes=1))
    assert (await late.output()).outcome == "to the pick-up point"  # type: ignore[attr-defined]

"""Races over any order of inputs (issue 41): whatever comes, in whatever order, with
duplicates and answers to what was never asked, the winner of ``ctx.first`` (and of a
``ctx.timeout`` scope against its block) is the first racer's input in history, a replay
of the stored JSON agrees, and a step that lost after its command was sent owes exactly
one compensation, completed at most once."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from saga_engine import Saga, SagaContext, SagaTimeout, Signal
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import (
    Inbound,
    Reply,
    SignalInput,
    StartSaga,
    TimerDue,
    command_id_for,
)
from saga_engine.core.history._events import CompensationCompleted, CompensationIssued
from saga_engine.core.runtime._runtime import SagaRuntime
from tests.internal.unit.test_races import (
    RACERS,
    T0,
    Won,
    command_of,
    input_of,
    replays_the_same,
    round_trip,
    start,
    status_of,
)
from tests.test_races import Charge, Empty, Refund

#: What may reach the saga: each racer's input, the refund's answer (perhaps before the
#: refund is sent: an unknown command then), a second copy of any of them.
ITEMS = st.lists(st.sampled_from([*RACERS, "refund"]), min_size=1, max_size=8).filter(
    lambda items: any(i in RACERS for i in items)
)


def _refund_answer(saga_id: str, at: object) -> Inbound:
    command_id = command_id_for(saga_id, "charge", 0, compensation=True)
    return Reply(command_id, "success", at, {})  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(items=ITEMS)
def test_the_first_racer_in_history_wins_and_a_lost_step_is_undone_once(
    items: list[str],
) -> None:
    rt = start()
    winner = next(i for i in items if i in RACERS)
    for n, item in enumerate(items, start=1):
        at = T0 + timedelta(seconds=n)
        inbound = _refund_answer(rt.saga_id, at) if item == "refund" else input_of(rt, item, at)
        rt.handle(inbound)  # refused inputs raise; none of these may be
    end = T0 + timedelta(minutes=1)
    rt.handle(_refund_answer(rt.saga_id, end))  # the refund's answer, if still owed
    rt.handle(SignalInput(signal_id="close", name="close", at=end))
    assert status_of(rt).is_terminal
    assert rt.output is not None
    assert rt.output["won"] == winner
    issued = [e for e in rt.history if isinstance(e, CompensationIssued)]
    completed = [e for e in rt.history if isinstance(e, CompensationCompleted)]
    # The charge is sent at the start: lost, it may have been applied, and is refunded
    # once; won, it is kept.
    assert len(issued) == (0 if winner == "charged" else 1)
    assert len(completed) == len(issued)
    replays_the_same(rt)
    rt.close()


class ScopedCharge(Saga[Empty, Won]):
    """The charge under a five-minute ``ctx.timeout``: the block or its timer wins."""

    name = "scoped-charge"
    close = Signal(Empty)

    async def run(self, ctx: SagaContext, input: Empty) -> Won:
        try:
            async with ctx.timeout(timedelta(minutes=5)):
                await ctx.step("charge", to="payments", command=Charge(), compensate=Refund())
            won = "charged"
        except SagaTimeout:
            won = "expired"
        await ctx.wait_signal(self.close)
        return Won(won=won)


SCOPED = SagaDefinition.of(ScopedCharge)


@settings(max_examples=200, deadline=None)
@given(
    items=st.lists(
        st.sampled_from(["charged", "expired", "refund"]), min_size=1, max_size=6
    ).filter(lambda items: "charged" in items or "expired" in items)
)
def test_a_timeout_scope_is_decided_by_history_and_undoes_its_step_once(
    items: list[str],
) -> None:
    rt, _ = SagaRuntime.start(
        SCOPED, StartSaga(saga_id="scoped-1", saga_type=ScopedCharge.name, input={}, at=T0)
    )
    winner = next(i for i in items if i != "refund")
    charge = command_of(rt.history, "charge")
    for n, item in enumerate(items, start=1):
        at = T0 + timedelta(seconds=n)
        if item == "charged":
            rt.handle(Reply(charge, "success", at, {}))
        elif item == "expired":
            rt.handle(TimerDue("scope:1", at))
        else:
            rt.handle(_refund_answer(rt.saga_id, at))
    end = T0 + timedelta(minutes=1)
    rt.handle(_refund_answer(rt.saga_id, end))
    rt.handle(SignalInput(signal_id="close", name="close", at=end))
    assert status_of(rt).is_terminal
    assert rt.output == {"won": winner, "value": ""}
    issued = [e for e in rt.history if isinstance(e, CompensationIssued)]
    assert len(issued) == (0 if winner == "charged" else 1)
    again, decision = SagaRuntime.replay(SCOPED, rt.saga_id, round_trip(rt.history))
    assert decision.nondeterminism is None
    assert decision.events == []
    assert again.output == rt.output
    again.close()
    rt.close()

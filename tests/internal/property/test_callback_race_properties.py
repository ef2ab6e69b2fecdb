"""An HTTP step completed by callback in a race, over any order of inputs (issue 41,
section 2): its service's 202, its call, the customer's stop, the timer, the undo's
answer, each perhaps twice. The step wins only once it was both accepted and called back
before any other racer's input; lost, at whatever point, it is compensated exactly once
and its URL takes no call; a replay of the stored JSON agrees."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from saga_engine import CallbackGone
from saga_engine.core.history._decision import (
    Inbound,
    Reply,
    SignalInput,
    TimerDue,
    command_id_for,
)
from saga_engine.core.history._events import (
    CallbackReceived,
    CompensationCompleted,
    CompensationIssued,
)
from saga_engine.core.runtime._runtime import SagaRuntime
from tests.internal.unit.test_callback_races import (
    T0,
    called_back,
    replays_the_same,
    request_id,
    start,
    status_of,
)

RIVALS = ("stopped", "expired")
ITEMS = st.lists(st.sampled_from(["accepted", "scored", *RIVALS, "undo"]), min_size=1, max_size=8)


def _input(rt: SagaRuntime, item: str, at: datetime) -> Inbound:
    if item == "accepted":
        return Reply(request_id(rt), "success", at, {"queued": True})
    if item == "stopped":
        return SignalInput(signal_id=f"stop-{at.isoformat()}", name="stop", at=at)
    if item == "expired":
        return TimerDue("sleep:1", at)
    undo = command_id_for(rt.saga_id, "fraud-check", 0, compensation=True)
    return Reply(undo, "success", at, {})


def _winner(items: list[str]) -> str:
    seen: set[str] = set()
    for item in items:
        if item in RIVALS:
            return item
        seen.add(item)
        if {"accepted", "scored"} <= seen:
            return "scored"
    return ""


@settings(max_examples=300, deadline=None)
@given(items=ITEMS)
def test_a_callback_step_wins_whole_or_is_undone_once(items: list[str]) -> None:
    rt = start()
    winner = _winner(items)
    refused = 0
    for n, item in enumerate(items, start=1):
        at = T0 + timedelta(seconds=n)
        if status_of(rt).is_terminal:
            break  # it ended (won, or lost and undone): what comes after is refused
        if item == "scored":
            try:
                called_back(rt, n / 60, {"score": 5})
            except CallbackGone:
                refused += 1  # the race was lost: its URL takes no call
        else:
            rt.handle(_input(rt, item, at))  # none of these may be refused
    end = T0 + timedelta(minutes=5)
    if not winner:
        rt.handle(TimerDue("sleep:1", end))  # nothing decided it yet: the timer does
        winner = "expired"
    if not status_of(rt).is_terminal:
        rt.handle(_input(rt, "undo", end))  # the undo's answer, still owed
    assert status_of(rt).is_terminal
    assert rt.output is not None
    assert rt.output["won"] == winner
    issued = [e for e in rt.history if isinstance(e, CompensationIssued)]
    completed = [e for e in rt.history if isinstance(e, CompensationCompleted)]
    # Its request is sent at the start: lost, it may have been applied (or was), and is
    # undone once; won, it is kept.
    assert len(issued) == (0 if winner == "scored" else 1)
    assert len(completed) == len(issued)
    calls = [e for e in rt.history if isinstance(e, CallbackReceived)]
    assert len(calls) <= 1
    # A call after the loss is refused (a call may come before the 202: recorded then,
    # and its repeat gets the same answer).
    assert refused == 0 or (winner != "scored" and not calls)
    replays_the_same(rt)
    rt.close()

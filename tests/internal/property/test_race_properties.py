"""Races over any order of inputs (issue 41): whatever comes, in whatever order, with
duplicates and answers to what was never asked, the winner of ``ctx.first`` is the first
racer's input in history, a replay of the stored JSON agrees, and a step that lost after
its command was sent owes exactly one compensation, completed at most once."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from saga_engine.core.history._decision import Inbound, Reply, SignalInput, command_id_for
from saga_engine.core.history._events import CompensationCompleted, CompensationIssued
from tests.internal.unit.test_races import (
    RACERS,
    T0,
    input_of,
    replays_the_same,
    start,
    status_of,
)

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

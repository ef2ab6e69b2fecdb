"""The fold of a history (``saga_engine.core._view.fold``) agrees with the runtime that made it.

The admin API, the web page and the CLI show a saga through the fold; the engine drives
it through the runtime. Drift between the two would show operators a saga that is not
the one running. So: hypothesis drives generated sagas through a simulated world
(``world.py``), and at every decision boundary the history so far is replayed into a
runtime and folded into a view, and the two must say the same things: status, error,
current step, commands in flight, held steps, timers, owed compensations (and their
order), and what the saga waits for. Histories parked by changed code are checked too.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from saga_engine.core._definition import SagaDefinition
from saga_engine.core._events import Event
from saga_engine.core._runtime import SagaRuntime
from saga_engine.core._view import OwedState, SagaView, WaitKind, fold
from tests.internal.property.sagas import Case, SignalSaga, definition
from tests.internal.property.test_runtime_properties import PROPERTY, cases
from tests.internal.property.world import simulate


def _awaited(rt: SagaRuntime) -> list[str]:
    return rt.awaited_signals()


def _agree(definition: SagaDefinition, saga_id: str, history: list[Event]) -> SagaView:
    """Replays ``history`` and checks the fold of what the replay holds against it."""
    rt, decision = SagaRuntime.replay(definition, saga_id, history)
    full = rt.history  # with the park marker, if the code deployed cannot replay it
    view = fold(full, saga_id=saga_id, awaited_signals=_awaited(rt))
    where = f"after {len(history)} events ({full[-1].describe()})"
    assert view.status == rt.status, where
    if rt.dead and not rt.status.is_terminal:
        # Parked: the runtime stopped where the code diverged and holds nothing more;
        # the view still shows the whole recorded history, and one thing to wait for.
        assert [w.kind for w in view.waiting_for] == [WaitKind.OPERATOR], where
        error = decision.projection.error
        assert (view.error.model_dump(mode="json") if view.error else None) == error, where
        return view
    if rt.dead:  # finished long ago: the replay stopped early, the view read it all
        assert view.waiting_for == (), where
        return view
    projected = decision.projection
    assert (view.error.model_dump(mode="json") if view.error else None) == projected.error, where
    assert view.current_step == projected.current_step, where
    assert {t.timer_id: t.fire_at for t in view.timers} == rt.pending_timers(), where
    outstanding = sorted(c.command_id for c in rt.outstanding_commands())
    assert sorted(f.command_id for f in view.in_flight if f.held is None) == outstanding, where
    assert sorted({f.step for f in view.in_flight if f.held is not None}) == rt.held_steps()
    held = set(rt.held_steps())
    stack = [o.step for o in view.owed if o.state != OwedState.IN_DOUBT and o.step not in held]
    if not rt.status.is_terminal:  # (a finished runtime keeps its stack; nothing is owed)
        assert stack == rt.owed_compensations(), where

    waits = {(w.kind, w.step if w.kind == WaitKind.REPLY else w.name) for w in view.waiting_for}
    for command in rt.outstanding_commands():
        assert (WaitKind.REPLY, command.step) in waits, where
    for name in _awaited(rt):
        assert (WaitKind.SIGNAL, name) in waits, where
    if view.status.is_terminal:
        assert view.waiting_for == (), where
        assert view.owed == (), where
    else:
        # An open saga always waits for something: a reply, a timer, a signal, a human.
        assert view.waiting_for, where
    return view


def _boundaries(history: list[Event], lengths: list[int]) -> list[list[Event]]:
    return [history[:n] for n in sorted(set(lengths)) if 0 < n <= len(history)]


@cases
@PROPERTY
@given(data=st.data())
def test_the_view_agrees_with_the_runtime_at_every_step(case: Case, data: st.DataObject) -> None:
    run = simulate(case.saga, data, snapshots=False)
    world, rt = run.world, run.world.rt
    history = rt.history
    lengths = [d.history_after for d in world.deliveries if d.decision is not None]
    for prefix in _boundaries(history, [*lengths, len(history)]):
        _agree(world.definition, rt.saga_id, prefix)
    # The same histories under changed code: parked, and the view says why.
    _agree(definition(case.renamed), rt.saga_id, history)


@PROPERTY
@given(data=st.data())
def test_the_view_names_the_signals_a_saga_waits_for(data: st.DataObject) -> None:
    run = simulate(SignalSaga, data, snapshots=False, signals=("confirm", "release"))
    rt = run.world.rt
    history = rt.history
    lengths = [d.history_after for d in run.world.deliveries if d.decision is not None]
    for prefix in _boundaries(history, [*lengths, len(history)]):
        view = _agree(run.world.definition, rt.saga_id, prefix)
        deadline = [w for w in view.waiting_for if w.kind == WaitKind.SIGNAL and w.until]
        for wait in deadline:
            assert wait.name == "confirm"  # only the first wait has a timeout

"""The operator's view of a history (``saga_engine.core.views._view.saga_view_of``), on generated sagas.

Where a saga stands (status, error, commands in flight, timers) is the one fold of history
the decision core is made of, so the view cannot drift from the runtime there; what is
checked here is what the view says, against what does not come from that fold:

- the status and the held replies, against the independent oracles of ``oracles.py``;
- the error, against the status it must go with;
- the compensations owed, against the stack the saga's code built (the code decides what
  compensation_started will owe; the view shows it before it is recorded);
- what the saga waits for: every command the code awaits, every signal it waits for, and
  always something while it is open.

hypothesis drives generated sagas through a simulated world (``world.py``) and each check
runs at every decision boundary, on the history replayed to that point; histories that
changed code no longer replays (parked) are checked too.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._events import Event
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.core.views._view import OwedState, SagaView, WaitKind, saga_view_of
from tests.internal.property.oracles import held_after_each, statuses_after_each
from tests.internal.property.sagas import Case, SignalSaga, definition
from tests.internal.property.test_runtime_properties import PROPERTY, cases
from tests.internal.property.world import simulate

S = SagaStatus

#: The error a saga reports in each status that has one of its own.
_ERROR_OF = {
    S.STEP_STUCK: {"InvalidReply"},
    S.COMPENSATION_STUCK: {"CompensationStuck"},
    S.NONDETERMINISTIC: {"NondeterminismError", "DefinitionError"},
}


def _check_error(view: SagaView, where: str) -> None:
    error = view.error.type if view.error is not None else None
    if view.status in _ERROR_OF:
        assert error in _ERROR_OF[view.status], where
    elif view.status in (S.RUNNING, S.COMPLETED):
        assert error is None, where
    elif view.status != S.CANCELLED:  # (a cancel with nothing to undo records no error)
        assert error is not None, where


def _check(definition: SagaDefinition, saga_id: str, history: list[Event]) -> SagaView:
    """Replays ``history`` and checks the view of what the replay holds."""
    rt, _ = SagaRuntime.replay(definition, saga_id, history)
    full = rt.history  # with the park marker, if the code deployed cannot replay it
    still = rt.awaited()
    view = saga_view_of(full, saga_id=saga_id, awaited=still or ())
    where = f"after {len(history)} events ({full[-1].describe()})"
    assert view.status == statuses_after_each(full)[-1], where
    held = held_after_each(full)[-1]
    if not view.status.is_terminal:
        assert {f.step for f in view.in_flight if f.held is not None} == held, where
    _check_error(view, where)
    if view.status.is_terminal:
        assert view.waiting_for == (), where
        assert view.owed == (), where
        return view
    if rt.dead:
        # Parked: nothing moves until an operator resumes it after a fixed deploy.
        assert [w.kind for w in view.waiting_for] == [WaitKind.OPERATOR], where
        return view
    stack = [o.step for o in view.owed if o.state != OwedState.IN_DOUBT and o.step not in held]
    assert stack == rt.owed_compensations(), where
    waits = {(w.kind, w.step if w.kind == WaitKind.REPLY else w.name) for w in view.waiting_for}
    for command in rt.outstanding_commands():
        assert (WaitKind.REPLY, command.step) in waits, where
    for name in still.signals if still is not None else ():
        assert (WaitKind.SIGNAL, name) in waits, where
    # An open saga always waits for something: a reply, a timer, a signal, a human.
    assert view.waiting_for, where
    return view


def _boundaries(history: list[Event], lengths: list[int]) -> list[list[Event]]:
    return [history[:n] for n in sorted(set(lengths)) if 0 < n <= len(history)]


@cases
@PROPERTY
@given(data=st.data())
def test_the_view_at_every_step_of_a_run(case: Case, data: st.DataObject) -> None:
    run = simulate(case.saga, data, snapshots=False)
    world, rt = run.world, run.world.rt
    history = rt.history
    lengths = [d.history_after for d in world.deliveries if d.decision is not None]
    for prefix in _boundaries(history, [*lengths, len(history)]):
        _check(world.definition, rt.saga_id, prefix)
    # The same histories under changed code: parked, and the view says why.
    _check(definition(case.renamed), rt.saga_id, history)


@PROPERTY
@given(data=st.data())
def test_the_view_names_the_signals_a_saga_waits_for(data: st.DataObject) -> None:
    run = simulate(SignalSaga, data, snapshots=False, signals=("confirm", "release"))
    rt = run.world.rt
    history = rt.history
    lengths = [d.history_after for d in run.world.deliveries if d.decision is not None]
    for prefix in _boundaries(history, [*lengths, len(history)]):
        view = _check(run.world.definition, rt.saga_id, prefix)
        deadline = [w for w in view.waiting_for if w.kind == WaitKind.SIGNAL and w.until]
        for wait in deadline:
            assert wait.name == "confirm"  # only the first wait has a timeout

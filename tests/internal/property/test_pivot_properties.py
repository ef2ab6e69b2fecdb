"""Property tests of parked steps and pivots (issue 26 §3 and §6) in the decision core.

The simulated world (``world.py``) drives sagas whose steps park when they cannot
succeed (``RetryPolicy(on_exhausted="park")``) and one whose pivot step passes or not;
operators retry and skip parked steps, cancel and force compensation, at random. A run
left parked at the end is cancelled by an operator. On every generated history:

1. nothing is ever compensated once the pivot passed (the pivot, the steps before it,
   the steps after it), and every cancel or forced compensation past it is refused with
   ``PastPivot``, leaving no trace;
2. a parked saga holds its compensation stack: when a run is stopped (cancel, forced
   compensation, deadline, a failure) it owes exactly its applied steps (and the step
   it was stopped in, if that one may have been applied), and compensates each once,
   the last applied first; a run parked at the end and then cancelled ends cancelled
   with its stack unwound;
3. replay is deterministic: the history replays (through JSON) to the same state, and a
   copy rebuilt mid-run makes the same decisions as the live one from then on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from saga_engine.core.history._decision import Cancel, ForceCompensate
from saga_engine.core.history._events import (
    AttemptTimedOut,
    CancelRequested,
    CommandIssued,
    CompensationCompleted,
    CompensationForced,
    CompensationIssued,
    CompensationStarted,
    Event,
    PivotPassed,
    ReplyReceived,
    RetryRequested,
    StepParked,
    StepSkipped,
    event_to_dict,
    events_from_list,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.kernel._errors import PastPivot
from tests.internal.property.sagas import ParkSaga, PivotSaga, PropertySaga, StepSpec
from tests.internal.property.test_runtime_properties import PROPERTY
from tests.internal.property.world import Outcome, Run, World, simulate

S = SagaStatus

#: Steps fail as often as they succeed here, so that runs park (and pass the pivot).
OUTCOMES: tuple[Outcome, ...] = ("success", "success", "failure", "retryable")

sagas = pytest.mark.parametrize("saga", [ParkSaga, PivotSaga], ids=["park", "pivot"])


def _run(saga: type[PropertySaga], data: st.DataObject) -> Run:
    """A simulated run (no held replies: these sagas are about parking), then an
    operator's cancel of a run left parked, driven to its end."""
    run = simulate(saga, data, bad_reply_weight=0, outcomes=OUTCOMES)
    world = run.world
    if world.rt.status == S.STEP_STUCK and world.parked_steps():
        event("left parked, then cancelled")
        world.deliver("final_cancel", Cancel("given up", world.tick(), "operator"))
        world.drain(resume_when_stuck=True, release_held=False)
    return run


@dataclass
class Stack:
    """What a sequential saga's history says it owes, as the runtime should: the
    compensatable steps applied, in order, and the step open now (in flight, or whose
    last attempt timed out)."""

    steps: dict[str, StepSpec]
    applied: list[str] = field(default_factory=list)
    current: str | None = None
    in_flight: bool = False
    unknown: bool = False
    parked: bool = False
    problems: list[str] = field(default_factory=list)

    def owed(self) -> list[str]:
        """The compensations owed if the run stopped now, in the order they run."""
        stack = list(self.applied)
        open_step = self.current
        maybe_applied = self.in_flight or self.unknown
        if open_step is not None and self.steps[open_step].compensate and maybe_applied:
            stack.append(open_step)
        return list(reversed(stack))

    def read(self, i: int, e: Event) -> None:
        if isinstance(e, CommandIssued):
            if e.step != self.current:
                self.current, self.unknown = e.step, False
            self.in_flight, self.parked = True, False
        elif isinstance(e, ReplyReceived | AttemptTimedOut) and not e.compensation:
            self.in_flight = False
            if isinstance(e, AttemptTimedOut):
                self.unknown = True
            elif e.outcome == "success":
                if self.steps[e.step].compensate:
                    self.applied.append(e.step)
                self.current = None
            else:  # refused or retryable: nothing applied under that command id
                self.unknown = False
        elif isinstance(e, StepParked):
            if e.in_doubt != self.unknown:
                self.problems.append(f"#{i + 1}: {e.step!r} parked in_doubt={e.in_doubt}")
            self.parked = True
        elif isinstance(e, StepSkipped) and not e.compensation:
            # A parked step done by hand whose last attempt may have been applied stays
            # owed; one skipped while waiting for its reply is the operator's.
            if self.parked and self.unknown and self.steps[e.step].compensate:
                self.applied.append(e.step)
            self.current, self.parked, self.in_flight = None, False, False


def _check_history(saga: type[PropertySaga], history: list[Event]) -> list[str]:
    stack = Stack(saga.steps)
    problems = stack.problems
    pivot_at: int | None = None
    expected: list[str] | None = None
    issued: list[str] = []
    for i, e in enumerate(history):
        if isinstance(e, PivotPassed):
            if pivot_at is not None:
                problems.append(f"#{i + 1}: a second pivot_passed")
            pivot_at = i
            if not saga.steps[e.step].pivot:
                problems.append(f"#{i + 1}: {e.step!r} passed as the pivot")
        elif isinstance(e, StepParked) and e.past_pivot != (pivot_at is not None):
            problems.append(f"#{i + 1}: parked with past_pivot={e.past_pivot}")
        elif isinstance(e, CancelRequested | CompensationForced) and pivot_at is not None:
            problems.append(f"#{i + 1}: {e.kind} recorded past the pivot")
        elif isinstance(e, CompensationStarted):
            if pivot_at is not None:
                problems.append(f"#{i + 1}: compensation started past the pivot")
            expected = stack.owed()
            if e.owed != expected:
                problems.append(f"#{i + 1}: owes {e.owed}, the stack held {expected}")
        elif isinstance(e, CompensationIssued) and e.attempt == 1:
            issued.append(e.step)
        stack.read(i, e)
    if pivot_at is not None and issued:
        problems.append(f"compensated {issued} with the pivot passed")
    if issued != (expected or [])[: len(issued)]:
        problems.append(f"compensations sent {issued}, owed {expected}")
    done = [e.step for e in history if isinstance(e, CompensationCompleted)]
    if len(done) != len(set(done)):
        problems.append(f"a compensation completed twice: {done}")
    return problems


@sagas
@PROPERTY
@given(data=st.data())
def test_nothing_is_compensated_past_the_pivot_and_stops_there_are_refused(
    saga: type[PropertySaga], data: st.DataObject
) -> None:
    world = _run(saga, data).world
    passed = [i for i, e in enumerate(world.rt.history) if isinstance(e, PivotPassed)]
    if saga is ParkSaga:
        assert passed == []
    for d in world.deliveries:
        if not isinstance(d.inbound, Cancel | ForceCompensate):
            continue
        if passed and d.history_before > passed[0]:
            # Refused: past its pivot while it goes forward; once ended, as any stop is.
            assert d.refused is not None, (d.kind, d.status_before)
            if not d.status_before.is_terminal:
                event("a stop refused past the pivot")
                assert isinstance(d.refused, PastPivot), (d.refused, d.status_before)
            assert d.history_after == d.history_before
            assert d.status_after == d.status_before
    if passed:
        event("pivot passed")
        assert world.rt.status in (S.COMPLETED, S.STEP_STUCK), world.rt.status
        assert not [e for e in world.rt.history if isinstance(e, CompensationIssued)]
    assert _check_history(saga, world.rt.history) == []


@sagas
@PROPERTY
@given(data=st.data())
def test_a_parked_saga_holds_its_stack_and_a_stop_unwinds_it_once_in_reverse(
    saga: type[PropertySaga], data: st.DataObject
) -> None:
    world = _run(saga, data).world
    history = world.rt.history
    assert _check_history(saga, history) == []
    parked_then_stopped = False
    for d in world.deliveries:
        stop = isinstance(d.inbound, Cancel | ForceCompensate)
        if stop and d.status_before == S.STEP_STUCK and d.refused is None:
            parked_then_stopped = True
    started = [e for e in history if isinstance(e, CompensationStarted)]
    if world.rt.status in (S.CANCELLED, S.COMPENSATED):
        owed = started[0].owed if started else []
        done = [e.step for e in history if isinstance(e, CompensationCompleted)]
        # Each owed compensation completed once, in the stack's order (the world never
        # skips a compensation: resume retries it).
        assert done == owed
        if parked_then_stopped:
            event("parked, stopped and unwound")
    if any(d.kind == "final_cancel" for d in world.deliveries):
        assert world.rt.status == S.CANCELLED or _past_pivot(history)


def _past_pivot(history: list[Event]) -> bool:
    return any(isinstance(e, PivotPassed) for e in history)


def _json_roundtrip(history: list[Event]) -> list[Event]:
    return events_from_list([event_to_dict(e) for e in history])


@sagas
@PROPERTY
@given(data=st.data())
def test_every_parked_or_pivoted_history_replays_deterministically(
    saga: type[PropertySaga], data: st.DataObject
) -> None:
    world: World = _run(saga, data).world
    rt = world.rt
    replayed, decision = SagaRuntime.replay(
        world.definition, rt.saga_id, _json_roundtrip(rt.history)
    )
    assert decision.nondeterminism is None, str(decision.nondeterminism)
    assert decision.events == []
    assert decision.commands == []
    assert replayed.status == rt.status
    assert replayed.outstanding_commands() == rt.outstanding_commands()
    assert replayed.pending_timers() == rt.pending_timers()
    assert sorted(replayed.state.parked_steps) == world.parked_steps()
    assert replayed.state.past_pivot == rt.state.past_pivot == _past_pivot(rt.history)
    assert replayed.owed_compensations() == rt.owed_compensations()
    replayed.close()
    assert world.snapshots
    for snap in world.snapshots:
        assert snap.replay_decision.nondeterminism is None
        assert snap.replay_decision.events == []
        assert snap.replayed_status == snap.status
        assert snap.replayed_outstanding == snap.outstanding
    for shadow in world.shadows:
        assert shadow.history == rt.history
        assert shadow.status == rt.status
    assert world.mismatches == []
    if any(s.status == S.STEP_STUCK for s in world.snapshots):
        event("rebuilt while parked")
    # Sanity: the runs do reach what this file is about.
    if any(isinstance(e, RetryRequested) for e in rt.history):
        event("a parked step retried")

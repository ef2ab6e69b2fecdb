"""Property tests of the decision core: ``SagaRuntime`` driven by a simulated world.

No engine, no servers: hypothesis chooses what the participants, the clock and the
operator do (see ``world.py``), and the tests check the durability promises on what
the runtime decided:

1. replay reproduces the live run exactly (same status, outstanding commands, timers,
   and the same decisions when driven on from a replayed copy);
2. compensations run only for applied steps, last applied first;
3. every run ends terminal or parked, through allowed status transitions only;
4. duplicate, late and unknown replies and stale timers are dropped without a trace;
5. changed code replayed against a history parks the saga once, and the fixed code
   resumes it.
"""

from __future__ import annotations

import os
from datetime import datetime

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from saga_engine._decision import Cancel, DropReason, OutboundCommand, Reply, Resume, TimerDue
from saga_engine._definition import SagaDefinition
from saga_engine._errors import InvalidTransition
from saga_engine._events import (
    AttemptTimedOut,
    CancelRequested,
    CommandIssued,
    CompensationIssued,
    Event,
    ReplyReceived,
    SagaParked,
    SagaResumed,
    TimerFired,
    event_to_dict,
    events_from_list,
)
from saga_engine._runtime import SagaRuntime
from saga_engine._serde import canonical_hash
from saga_engine._status import TRANSITIONS, SagaStatus
from tests.property.oracles import check_compensations, reachable, status_transitions
from tests.property.sagas import CASES, Case, definition
from tests.property.world import Delivery, World, simulate

S = SagaStatus

#: Shrinking a failing run of a hundred interactive draws takes minutes; it is off unless
#: SAGA_PROPERTY_SHRINK=1, so a failure is reported at once (with a blob to replay it
#: under @reproduce_failure, then shrink it at leisure).
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate]
if os.environ.get("SAGA_PROPERTY_SHRINK") == "1":
    _PHASES.append(Phase.shrink)

PROPERTY = settings(
    max_examples=int(os.environ.get("SAGA_PROPERTY_EXAMPLES", "60")),
    deadline=None,
    database=None,  # write nothing outside tests/
    phases=_PHASES,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

cases = pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])


def _issued(history: list[Event]) -> list[CommandIssued | CompensationIssued]:
    return [e for e in history if isinstance(e, CommandIssued | CompensationIssued)]


def _json_roundtrip(history: list[Event]) -> list[Event]:
    """What a store hands back: every event through its JSON form."""
    return events_from_list([event_to_dict(e) for e in history])


def _assert_replays(
    definition: SagaDefinition,
    saga_id: str,
    history: list[Event],
    status: SagaStatus,
    outstanding: list[OutboundCommand],
    timers: dict[str, datetime],
) -> SagaRuntime:
    rt, decision = SagaRuntime.replay(definition, saga_id, history)
    assert decision.nondeterminism is None, str(decision.nondeterminism)
    assert decision.events == [], "replay recorded new events"
    assert decision.commands == [], "replay sent new commands"
    assert rt.status == status == decision.status
    assert rt.outstanding_commands() == outstanding
    assert rt.pending_timers() == timers
    assert rt.history == history
    return rt


Point = tuple[int, S, list[OutboundCommand], dict[str, datetime]]


def _open_points(world: World) -> list[Point]:
    """Decision boundaries where the saga was still open: history length and live state."""
    points: list[Point] = []
    start = world.start_decision
    if start is not None and not start.status.is_terminal:
        points.append((len(start.events), start.status, start.commands, world.start_timers))
    for d in world.deliveries:
        if d.decision is not None and d.decision.events and not d.status_after.is_terminal:
            points.append((d.history_after, d.status_after, d.outstanding_after, d.timers_after))
    return points


# --------------------------------------------------------------------------- 1. replay


@cases
@PROPERTY
@given(data=st.data())
def test_replay_reproduces_the_live_run(case: Case, data: st.DataObject) -> None:
    run = simulate(case.saga, data)
    world, rt = run.world, run.world.rt
    history = rt.history

    # At the end: the history replays (after a trip through JSON, as from the store) to
    # the same state, without recording or sending anything.
    _assert_replays(
        world.definition,
        rt.saga_id,
        _json_roundtrip(history),
        rt.status,
        rt.outstanding_commands(),
        rt.pending_timers(),
    )

    # At an intermediate point: the replayed copy matched the live runtime then, and,
    # driven on with the same inputs, made exactly the same decisions.
    assert world.snapshots
    for snap in world.snapshots:
        assert snap.replay_decision.nondeterminism is None, str(snap.replay_decision.nondeterminism)
        assert snap.replay_decision.events == []
        assert snap.replay_decision.commands == []
        assert snap.replayed_status == snap.replay_decision.status == snap.status
        assert snap.replayed_outstanding == snap.outstanding
        assert snap.replayed_timers == snap.timers
        assert snap.replayed_history == snap.history == history[: len(snap.history)]
    for shadow in world.shadows:
        assert shadow.history == history
        assert shadow.status == rt.status
        assert shadow.outstanding_commands() == rt.outstanding_commands()
    assert world.mismatches == []

    # The commands sent are exactly the issued events, in order; each decision sends
    # the commands its own events issued.
    issued = _issued(history)
    assert [(e.command_id, e.payload, isinstance(e, CompensationIssued)) for e in issued] == [
        (c.command_id, c.payload, c.compensation) for c in world.sent
    ]
    decisions = [world.start_decision] + [d.decision for d in world.deliveries]
    for decision in decisions:
        if decision is not None:
            assert [c.command_id for c in decision.commands] == [
                e.command_id for e in _issued(decision.events)
            ]

    # A command id always names the same command; forward and compensation ids differ.
    seen: dict[str, tuple[object, ...]] = {}
    for e in issued:
        assert e.payload_hash == canonical_hash(e.payload)
        what = (type(e).__name__, e.step, e.participant, e.command_type, e.payload_hash)
        assert seen.setdefault(e.command_id, what) == what, f"command id {e.command_id} reused"


# --------------------------------------------------------------------------- 2. compensation


@cases
@PROPERTY
@given(data=st.data())
def test_compensations_run_only_for_applied_steps_in_reverse_order(
    case: Case, data: st.DataObject
) -> None:
    run = simulate(case.saga, data, snapshots=False)
    rt = run.world.rt
    report = check_compensations(rt.history, case.saga.steps)
    assert report.problems == []
    if rt.status == S.COMPLETED:
        assert report.compensated == []
    if rt.status in (S.COMPENSATED, S.CANCELLED) and report.expected_owed is not None:
        assert report.compensated == report.expected_owed
    if rt.status == S.COMPENSATION_STUCK:
        assert report.expected_owed is not None
        assert report.compensated, "stuck on a compensation that was never sent"


# --------------------------------------------------------------------------- 3. status


def _check_operator_action(d: Delivery) -> None:
    if d.kind == "cancel":
        assert (d.refused is not None) == (d.status_before != S.RUNNING), (
            f"cancel in {d.status_before}: refused={d.refused}"
        )
        if d.decision is not None:
            assert isinstance(d.decision.events[0], CancelRequested)
            assert d.status_after in (S.COMPENSATING, S.CANCELLED)
    if d.kind in ("resume", "drain_resume"):
        assert (d.refused is not None) == (d.status_before != S.COMPENSATION_STUCK), (
            f"resume in {d.status_before}: refused={d.refused}"
        )
        if d.decision is not None:
            assert isinstance(d.decision.events[0], SagaResumed)


@cases
@PROPERTY
@given(data=st.data())
def test_every_run_ends_terminal_or_parked_through_allowed_transitions(
    case: Case, data: st.DataObject
) -> None:
    run = simulate(case.saga, data, snapshots=False)
    world, rt = run.world, run.world.rt
    event(f"ended {rt.status.value}")
    seen = {d.status_after for d in world.deliveries}
    for status in (S.COMPENSATION_STUCK, S.COMPENSATING):
        if status in seen:
            event(f"went through {status.value}")
    for kind in ("cancel", "resume"):
        if any(d.kind == kind and d.decision is not None for d in world.deliveries):
            event(f"{kind} accepted")
    if any(isinstance(e, TimerFired) and e.timer_id == "deadline" for e in rt.history):
        event("deadline fired")
    # The drain left nothing deliverable; the saga must not be left hanging.
    assert rt.status.is_terminal or rt.status.is_parked, f"stranded in {rt.status}"
    if run.resume_when_stuck:
        assert rt.status.is_terminal
    if rt.status.is_parked:
        assert rt.outstanding_commands() == []
        assert rt.pending_timers() == {}

    changes, folded = status_transitions(rt.history)
    assert folded == rt.status
    for index, old, new in changes:
        assert new in TRANSITIONS[old], f"event #{index + 1}: {old} -> {new} is not allowed"

    assert world.start_decision is not None
    previous = world.start_decision.status
    for d in world.deliveries:
        assert d.status_before == previous
        if d.decision is not None:
            assert d.decision.status == d.status_after
            assert reachable(d.status_before, d.status_after), (
                f"{d.kind}: {d.status_before} -> {d.status_after}"
            )
            projection = d.decision.projection
            ended = d.status_after.is_terminal or d.status_after.is_parked
            expected_wakeup = None if ended else min(d.timers_after.values(), default=None)
            assert projection.next_wakeup == expected_wakeup
        else:
            assert d.history_after == d.history_before, "a refused input left a trace"
            assert d.status_after == d.status_before
        if d.status_after == S.COMPENSATION_STUCK:
            # Stuck means waiting for an operator, and for nothing else.
            assert d.outstanding_after == []
            assert d.timers_after == {}
        if any(c.compensation for c in d.outstanding_after):
            assert d.status_after == S.COMPENSATING, (
                f"a compensation is in flight while the saga is {d.status_after}"
            )
        if d.status_after.is_terminal:
            assert d.outstanding_after == []
            assert d.timers_after == {}
        _check_operator_action(d)
        previous = d.status_after


# --------------------------------------------------------------------------- 4. drops


_INPUT_EVENTS = {
    "reply": (ReplyReceived,),
    "drain_reply": (ReplyReceived,),
    "timer": (AttemptTimedOut, TimerFired),
    "drain_timer": (AttemptTimedOut, TimerFired),
}


@cases
@PROPERTY
@given(data=st.data())
def test_duplicate_late_and_unknown_inputs_are_dropped_without_a_trace(
    case: Case, data: st.DataObject
) -> None:
    run = simulate(case.saga, data, snapshots=False)
    noise = 0
    for d in run.world.deliveries:
        if d.expected_drop is not None:
            noise += 1
            assert d.decision is not None, f"{d.kind} refused: {d.refused}"
            assert d.decision.dropped == d.expected_drop, f"{d.kind}: {d.inbound!r}"
            assert d.decision.events == []
            assert d.decision.commands == []
            assert d.history_after == d.history_before
            assert d.status_after == d.status_before
        elif d.kind in _INPUT_EVENTS:
            # A reply to an awaited command, a pending timer: recorded, never dropped.
            assert d.decision is not None
            assert d.decision.dropped is None
            assert isinstance(d.decision.events[0], _INPUT_EVENTS[d.kind])
            assert d.history_after == d.history_before + len(d.decision.events)
    # Terminal sagas drop everything the world can still throw at them.
    rt = run.world.rt
    for command in run.world.sent[:3]:
        at = run.world.tick()
        if rt.status.is_terminal:
            before = len(rt.history)
            decision = rt.handle(Reply(command.command_id, "success", at))
            assert decision.dropped == DropReason.DUPLICATE_REPLY
            assert rt.handle(TimerDue("timeout:x:1", at)).dropped == DropReason.STALE_TIMER
            assert len(rt.history) == before
    assert noise == sum(
        d.kind in ("duplicate", "late", "unknown", "stale_timer") for d in run.world.deliveries
    )


# --------------------------------------------------------------------------- 5. changed code


def _first_command_index(history: list[Event], step: str | None) -> int | None:
    for i, e in enumerate(history):
        if isinstance(e, CommandIssued) and (step is None or e.step == step):
            return i
    return None


@cases
@PROPERTY
@given(data=st.data())
def test_changed_code_parks_once_and_the_fixed_code_resumes(
    case: Case, data: st.DataObject
) -> None:
    run = simulate(case.saga, data, snapshots=False)
    world = run.world
    full = world.rt.history
    points = _open_points(world)
    assert points, "the saga starts open"
    stuck = [p for p in points if p[1] == S.COMPENSATION_STUCK]
    prefer_stuck = data.draw(st.booleans(), label="park a stuck saga")
    if stuck and prefer_stuck:
        points = stuck  # rare, and the hardest case: two kinds of parked at once
    length, status, outstanding, timers = points[
        data.draw(st.integers(0, len(points) - 1), label="point")
    ]
    history = full[:length]
    event(f"parked while {status.value}")
    saga_id = world.rt.saga_id
    original = world.definition
    at = history[-1].at

    for broken_cls, step in ((case.payload_changed, None), (case.renamed, case.renamed_step)):
        broken = definition(broken_cls)
        diverges_at = _first_command_index(history, step)
        rt_b, d_b = SagaRuntime.replay(broken, saga_id, history)
        if diverges_at is None:
            # The changed step was never reached: the changed code replays cleanly.
            assert d_b.nondeterminism is None
            assert d_b.events == []
            assert rt_b.status == status
            assert rt_b.outstanding_commands() == outstanding
            continue
        assert d_b.nondeterminism is not None
        assert d_b.nondeterminism.seq == diverges_at + 1
        assert [type(e) for e in d_b.events] == [SagaParked]
        assert d_b.commands == []
        assert rt_b.status == d_b.status == S.NONDETERMINISTIC
        assert rt_b.dead
        assert rt_b.outstanding_commands() == []
        parked = history + d_b.events

        # The same broken code again: still nondeterministic, parked only once.
        rt_b2, d_b2 = SagaRuntime.replay(broken, saga_id, _json_roundtrip(parked))
        assert d_b2.nondeterminism is not None
        assert d_b2.events == []
        assert rt_b2.status == S.NONDETERMINISTIC
        with pytest.raises(InvalidTransition):
            rt_b2.handle(Resume(at, "operator", "too early"))

        # The original code: replays the parked history cleanly and stays parked...
        rt_o = _assert_replays(
            original, saga_id, _json_roundtrip(parked), S.NONDETERMINISTIC, outstanding, timers
        )
        for command in outstanding[:1]:
            reply = rt_o.handle(Reply(command.command_id, "success", at))
            assert reply.dropped == DropReason.PARKED
            assert reply.events == []
        with pytest.raises(InvalidTransition):
            rt_o.handle(Cancel("not while parked", at))
        assert len(rt_o.history) == len(parked)

        # ...until an operator resumes it; then it goes on to a terminal or parked end.
        resumed = rt_o.handle(Resume(at, "operator", "fixed"))
        assert isinstance(resumed.events[0], SagaResumed)
        assert resumed.nondeterminism is None
        assert not rt_o.dead
        if status != S.COMPENSATION_STUCK:
            assert rt_o.status == status
            assert rt_o.outstanding_commands() == outstanding
            assert rt_o.pending_timers() == timers
        elif rt_o.outstanding_commands():
            assert rt_o.status == S.COMPENSATING, "compensation re-sent while reported stuck"
        on = World.adopt(original, rt_o, max(world.now, at))
        on.drain(resume_when_stuck=True)
        assert rt_o.status.is_terminal, rt_o.status
        changes, folded = status_transitions(rt_o.history)
        assert folded == rt_o.status
        for index, old, new in changes:
            assert new in TRANSITIONS[old], f"event #{index + 1}: {old} -> {new}"
        assert check_compensations(rt_o.history, case.saga.steps).problems == []
        _assert_replays(original, saga_id, rt_o.history, rt_o.status, [], {})


@cases
@PROPERTY
@given(data=st.data())
def test_changed_code_never_reopens_a_finished_saga(case: Case, data: st.DataObject) -> None:
    """A finished saga's history replayed by changed code: reported, but it stays finished.

    Replaying a terminal history happens in practice: the engine rebuilds an evicted saga
    whenever any input (a late duplicate reply) arrives for it, and the CLI replays stored
    histories to check a deploy.
    """
    run = simulate(case.saga, data, snapshots=False)
    rt = run.world.rt
    if not rt.status.is_terminal:
        return
    final = rt.status
    broken = definition(case.payload_changed)
    _, d_b = SagaRuntime.replay(broken, rt.saga_id, rt.history)
    assert d_b.nondeterminism is not None, "changed code must be reported"
    assert not any(isinstance(e, SagaParked) for e in d_b.events), (
        f"a {final.value} saga was parked as nondeterministic"
    )
    rt_o, _ = SagaRuntime.replay(run.world.definition, rt.saga_id, rt.history + d_b.events)
    assert rt_o.status == final, f"a {final.value} saga now reads as {rt_o.status.value}"

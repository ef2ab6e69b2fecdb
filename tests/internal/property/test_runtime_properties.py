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
   resumes it;
6. a success reply its step's model refuses is held: nothing reacts to it, the saga is
   step_stuck while any is held, operators' refused actions leave no trace, a skip
   releases the step (then owed its compensation), a cancel compensates it;
7. a deploy whose model reads the held reply accepts it on retry, and its history
   then replays under that code only.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import (
    Cancel,
    DropReason,
    OutboundCommand,
    Reply,
    Resume,
    RetryStep,
    Skip,
    TimerDue,
)
from saga_engine.core.history._events import (
    AttemptTimedOut,
    CancelRequested,
    CommandIssued,
    CompensationForced,
    CompensationIssued,
    CompensationStuck,
    Event,
    InvalidReplyReceived,
    ReplyReceived,
    RetryRequested,
    SagaParked,
    SagaResumed,
    StepSkipped,
    TimerFired,
    event_to_dict,
    events_from_list,
)
from saga_engine.core.history._status import TRANSITIONS, SagaStatus
from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.kernel._errors import InvalidPayload, InvalidTransition, NondeterminismError
from saga_engine.kernel._serde import canonical_hash, storable_copy, unstorable
from tests.internal.property.oracles import (
    check_compensations,
    held_after_each,
    reachable,
    status_transitions,
    statuses_after_each,
)
from tests.internal.property.sagas import CASES, Case, definition
from tests.internal.property.world import VALID_RESULT, Delivery, World, simulate

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
    held = held_after_each(history)
    assert rt.held_steps() == sorted(held[-1] if held else ())
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
        assert snap.replayed_held == snap.held
        assert snap.replayed_history == snap.history == history[: len(snap.history)]
    for shadow in world.shadows:
        assert shadow.history == history
        assert shadow.status == rt.status
        assert shadow.outstanding_commands() == rt.outstanding_commands()
        assert shadow.pending_timers() == rt.pending_timers()
        assert shadow.held_steps() == rt.held_steps()
    assert world.mismatches == []
    if any(s.status == S.STEP_STUCK for s in world.snapshots):
        event("rebuilt while step_stuck")

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
    for step in report.released_steps:
        if case.saga.steps[step].compensate and report.expected_owed is not None:
            assert step in report.expected_owed, f"{step!r} was released (applied) but not owed"
            event("a released held step was owed its compensation")
    for step in report.stopped_while_held:
        if case.saga.steps[step].compensate:
            assert report.expected_owed is not None
            assert step in report.expected_owed, f"{step!r} was stopped while held, not owed"
            event("a step stopped while held was owed its compensation")
    for step in report.skipped_steps:
        assert step not in (report.expected_owed or []), f"{step!r} skipped unanswered, owed"
    if rt.status == S.COMPLETED:
        assert report.compensated == []
    if rt.status in (S.COMPENSATED, S.CANCELLED) and report.expected_owed is not None:
        assert sorted(report.compensated) == sorted(report.expected_owed)
    if rt.status == S.COMPENSATION_STUCK:
        assert report.expected_owed is not None
        assert report.compensated, "stuck on a compensation that was never sent"


# --------------------------------------------------------------------------- 3. status


_FORWARD = (S.RUNNING, S.STEP_STUCK)


def _check_operator_action(d: Delivery) -> None:
    if d.kind in ("cancel", "force"):
        assert (d.refused is not None) == (d.status_before not in _FORWARD), (
            f"{d.kind} in {d.status_before}: refused={d.refused!r}"
        )
        assert d.refused is None or isinstance(d.refused, InvalidTransition)
        if d.decision is not None:
            if d.kind == "cancel":
                assert isinstance(d.decision.events[0], CancelRequested)
                assert d.status_after in (S.COMPENSATING, S.CANCELLED)
            else:
                assert isinstance(d.decision.events[0], CompensationForced)
                assert d.status_after in (S.COMPENSATING, S.COMPENSATED, S.FAILED)
            if d.status_before == S.STEP_STUCK:
                event(f"{d.kind} while step_stuck")
    if d.kind in ("resume", "drain_resume"):
        assert (d.refused is not None) == (d.status_before != S.COMPENSATION_STUCK), (
            f"resume in {d.status_before}: refused={d.refused!r}"
        )
        assert d.refused is None or isinstance(d.refused, InvalidTransition)
        if d.status_before == S.STEP_STUCK:
            assert "step_stuck" in str(d.refused), str(d.refused)
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
        assert rt.status.is_terminal or (rt.status == S.STEP_STUCK and not run.release_held)
    if run.release_held:
        assert rt.status != S.STEP_STUCK
    if rt.status.is_parked:
        assert rt.outstanding_commands() == []
        assert rt.pending_timers() == {}
    if rt.status == S.STEP_STUCK:
        # Left to an operator who never came: it waits for one, and for nothing else.
        assert rt.held_steps()

    changes, folded = status_transitions(rt.history)
    assert folded == rt.status
    for index, old, new in changes:
        assert new in TRANSITIONS[old], f"event #{index + 1}: {old} -> {new} is not allowed"

    assert world.start_decision is not None
    previous = world.start_decision.status
    # The status after each input, folded from the history alone.
    folded_after = statuses_after_each(rt.history)
    for d in world.deliveries:
        assert d.status_before == previous
        assert d.status_after == folded_after[d.history_after - 1], (
            f"{d.kind}: {d.status_after}, but the history reads {folded_after[d.history_after - 1]}"
        )
        if d.decision is not None:
            assert d.decision.status == d.status_after
            assert reachable(d.status_before, d.status_after), (
                f"{d.kind}: {d.status_before} -> {d.status_after}"
            )
            projection = d.decision.projection
            # step_stuck still has timers to fire: the deadline, a gather's other steps.
            ended = d.status_after.is_terminal or d.status_after == S.NONDETERMINISTIC
            expected_wakeup = None if ended else min(d.timers_after.values(), default=None)
            assert projection.next_wakeup == expected_wakeup
        else:
            assert d.history_after == d.history_before, "a refused input left a trace"
            assert d.status_after == d.status_before
            assert d.outstanding_after == d.outstanding_before
            assert d.timers_after == d.timers_before
            assert d.held_after == d.held_before
        if d.status_after == S.COMPENSATION_STUCK:
            # A stuck compensation waits for an operator, and for nothing else; the
            # compensations undone beside it (a gather's other branches) go on.
            stuck = _stuck_steps(rt.history[: d.history_after])
            assert stuck
            assert not [c.step for c in d.outstanding_after if c.step in stuck]
            assert not [t for t in d.timers_after if t.split(":")[2:3] and t.split(":")[2] in stuck]
        if any(c.compensation for c in d.outstanding_after):
            assert d.status_after in (S.COMPENSATING, S.COMPENSATION_STUCK), (
                f"a compensation is in flight while the saga is {d.status_after}"
            )
        if d.status_after.is_terminal:
            assert d.outstanding_after == []
            assert d.timers_after == {}
        _check_operator_action(d)
        previous = d.status_after


def _stuck_steps(history: list[Any]) -> set[str]:
    """The steps whose compensation is stuck at the end of ``history``."""
    stuck: set[str] = set()
    for e in history:
        if isinstance(e, CompensationStuck):
            stuck.add(e.step)
        elif isinstance(e, SagaResumed):
            stuck.clear()
        elif isinstance(e, StepSkipped | RetryRequested) and e.step in stuck:
            stuck.discard(e.step)
    return stuck


# --------------------------------------------------------------------------- 4. drops


_INPUT_EVENTS = {
    "reply": (ReplyReceived,),
    "bad_reply": (ReplyReceived, InvalidReplyReceived),
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
    stuck = [p for p in points if p[1] in (S.COMPENSATION_STUCK, S.STEP_STUCK)]
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
        assert isinstance(d_b.nondeterminism, NondeterminismError), d_b.nondeterminism
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
            assert rt_o.held_steps() == sorted(held_after_each(history)[-1])
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


# --------------------------------------------------------------------------- 6. held replies


def _check_held_action(
    d: Delivery, held_events: dict[str, InvalidReplyReceived], compensations: set[str]
) -> None:
    """What each input about a held reply must have done (or been refused for)."""
    decision = d.decision
    if d.kind == "bad_reply":
        assert isinstance(d.inbound, Reply)
        assert decision is not None, f"a participant's reply was refused: {d.refused!r}"
        first = decision.events[0]
        payload = d.inbound.payload
        if d.inbound.command_id in compensations:
            # A compensation's reply is never checked against a model: recorded as it came.
            assert isinstance(first, ReplyReceived)
            assert first.compensation
            assert first.payload == storable_copy(payload)
            return
        assert isinstance(first, InvalidReplyReceived), first
        assert decision.events == [first], "something reacted to a held reply"
        assert decision.commands == []
        assert first.payload == storable_copy(payload)
        assert first.unstorable == bool(unstorable(payload))
        assert first.error.type == "InvalidReply"
        assert first.error.step == first.step
        assert d.status_after == S.STEP_STUCK
        assert first.step in d.held_after
        event("held an unstorable reply" if first.unstorable else "held a malformed reply")
        if d.held_before:
            event("held a second reply")
        if d.outstanding_after:
            event("held a reply while other commands are out")
    elif d.kind in ("skip_held", "drain_skip"):
        assert isinstance(d.inbound, Skip)
        assert decision is not None, f"a valid skip of a held step was refused: {d.refused!r}"
        assert decision.events[0] == StepSkipped(
            at=d.inbound.at,
            step=d.inbound.step,
            payload=VALID_RESULT,
            principal="operator",
            reason="answered by hand",
        )
        assert d.inbound.step not in d.held_after
        if d.held_after:
            assert d.status_after == S.STEP_STUCK
        else:
            assert d.status_after != S.STEP_STUCK, "released the last held reply, still stuck"
            assert d.status_before == S.STEP_STUCK
        event("released a held step by a skip")
    elif d.kind == "skip_invalid":
        assert isinstance(d.inbound, Skip)
        assert isinstance(d.refused, InvalidPayload), (
            f"skip with {d.inbound.payload}: {d.refused!r}"
        )
        assert d.refused.errors
        assert all(e["loc"][0] == "result" for e in d.refused.errors), d.refused.errors
        if d.inbound.step in d.held_before:
            event("refused an invalid skip of a held step")
    elif d.kind == "retry_held":
        assert isinstance(d.inbound, RetryStep)
        assert isinstance(d.refused, InvalidTransition), f"retry of a held reply: {d.refused!r}"
        if held_events[d.inbound.step].unstorable:
            assert "cannot be accepted as it came" in str(d.refused)
        else:
            assert "still does not match Ack" in str(d.refused)
        event("refused a retry of a held reply")
    elif d.kind == "skip_waiting":
        assert isinstance(d.inbound, Skip)
        assert decision is not None, f"a skip of a waiting step was refused: {d.refused!r}"
        assert isinstance(decision.events[0], StepSkipped)
        assert d.held_after == d.held_before
    elif d.kind == "retry_backoff":
        assert isinstance(d.inbound, RetryStep)
        assert decision is not None, f"a retry of a step in back-off was refused: {d.refused!r}"
        assert isinstance(decision.events[0], RetryRequested)
        issued = [e for e in decision.events if isinstance(e, CommandIssued)]
        assert d.inbound.step in [e.step for e in issued], "retried now, but nothing was sent"
    elif (
        isinstance(d.inbound, TimerDue)
        and d.inbound.timer_id == "deadline"
        and d.status_before == S.STEP_STUCK
    ):
        assert d.status_after in (S.COMPENSATING, S.FAILED), d.status_after
        event("deadline while step_stuck")


@cases
@PROPERTY
@given(data=st.data())
def test_a_reply_its_model_refuses_is_held_until_an_operator_answers(
    case: Case, data: st.DataObject
) -> None:
    run = simulate(case.saga, data, snapshots=False, bad_reply_weight=5)
    world, rt = run.world, run.world.rt
    history = rt.history
    held = held_after_each(history)
    held_events = {e.step: e for e in history if isinstance(e, InvalidReplyReceived)}
    compensations = {e.command_id for e in history if isinstance(e, CompensationIssued)}
    for d in world.deliveries:
        # The runtime's account of held replies is the history's (computed independently).
        expected = sorted(held[d.history_after - 1])
        assert d.held_after == expected, f"{d.kind}: holds {d.held_after}, history {expected}"
        assert (d.status_after == S.STEP_STUCK) == bool(expected), (
            f"{d.kind}: {d.status_after} with held replies {expected}"
        )
        for step in expected:
            # Answered already: not re-sent on recovery, and its attempt no longer times out.
            command_id = held_events[step].command_id
            assert command_id not in [c.command_id for c in d.outstanding_after]
            assert not any(t.startswith(f"timeout:{command_id}:") for t in d.timers_after)
        if d.refused is not None:
            assert d.history_after == d.history_before, "a refused input left a trace"
            assert (d.status_after, d.held_after) == (d.status_before, d.held_before)
        _check_held_action(d, held_events, compensations)
    if rt.status == S.STEP_STUCK:
        event("ended step_stuck")


# --------------------------------------------------------------------------- 7. a fixed deploy


@cases
@PROPERTY
@given(data=st.data())
def test_a_fixed_reply_model_accepts_held_replies_on_retry(case: Case, data: st.DataObject) -> None:
    run = simulate(case.saga, data, snapshots=False, bad_reply_weight=5)
    world = run.world
    full = world.rt.history
    points = [p for p in _open_points(world) if p[1] == S.STEP_STUCK]
    if not points:
        event("never step_stuck")
        return
    length, status, outstanding, timers = points[
        data.draw(st.integers(0, len(points) - 1), label="point")
    ]
    history = full[:length]
    saga_id = world.rt.saga_id
    fixed = definition(case.lenient)

    # The fixed code replays the history, held replies included, to where it stood.
    rt = _assert_replays(fixed, saga_id, _json_roundtrip(history), status, outstanding, timers)
    held_events = {e.step: e for e in history if isinstance(e, InvalidReplyReceived)}
    on = World.adopt(fixed, rt, max(world.now, history[-1].at))
    for step in rt.held_steps():
        on.deliver("retry_fixed", RetryStep(step, on.tick(), "operator", "deployed a fix"))
        d = on.deliveries[-1]
        if held_events[step].unstorable:
            assert isinstance(d.refused, InvalidTransition), d.refused
            assert "cannot be accepted as it came" in str(d.refused)
            assert d.history_after == d.history_before
            continue
        assert d.decision is not None, f"the fixed code refused the held reply: {d.refused!r}"
        assert isinstance(d.decision.events[0], RetryRequested)
        assert step not in d.held_after
        assert (d.status_after == S.STEP_STUCK) == bool(d.held_after)
        event("the fixed code accepted a held reply")
    for _ in range(data.draw(st.integers(0, 10), label="inputs after the fix")):
        on.random_step(data)
    on.drain(resume_when_stuck=True)
    final = rt.history
    assert rt.status.is_terminal, rt.status

    changes, folded = status_transitions(final)
    assert folded == rt.status
    for index, old, new in changes:
        assert new in TRANSITIONS[old], f"event #{index + 1}: {old} -> {new}"
    assert check_compensations(final, case.saga.steps).problems == []
    _assert_replays(fixed, saga_id, _json_roundtrip(final), rt.status, [], {})

    # The code that refused the reply cannot replay a history where it was accepted.
    held = held_after_each(final)
    accepted = [
        i
        for i, e in enumerate(final)
        if isinstance(e, RetryRequested) and e.step in held[i - 1] and e.step not in held[i]
    ]
    if accepted:
        _, strict = SagaRuntime.replay(world.definition, saga_id, final)
        assert isinstance(strict.nondeterminism, NondeterminismError), (
            "a retry the old code refuses replayed under it: "
            + "; ".join(f"#{i + 1} {e.kind} {getattr(e, 'step', '')}" for i, e in enumerate(final))
        )
        # Reported at the first accepted retry: nothing before it depends on the fix.
        assert strict.nondeterminism.seq == accepted[0] + 1, str(strict.nondeterminism)
        event("the old code refused to replay an accepted retry")

"""Independent oracles: what a history *should* contain, computed from the events alone.

They use the saga's static step table, never the runtime's own bookkeeping (its stack
of owed compensations, its status, its held replies), so they can catch the runtime
contradicting itself.

A held reply (``invalid_reply_received``) is a forward step's success the step's model
refused: the participant applied the step, the step keeps waiting, and the saga is
``step_stuck`` while any reply is held. An operator's ``step_skipped`` or an accepted
``retry_requested`` releases it, and the step then counts as applied; stopped while
held (cancel, deadline, a sibling's failure), it counts as applied too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from saga_engine.core.history._decision import DEADLINE_TIMER
from saga_engine.core.history._events import (
    AttemptTimedOut,
    CancelRequested,
    CommandIssued,
    CompensationCompleted,
    CompensationForced,
    CompensationIssued,
    CompensationStarted,
    CompensationStuck,
    ErrorInfo,
    Event,
    InvalidReplyReceived,
    ReplyReceived,
    RetryRequested,
    SagaCancelled,
    SagaCompensated,
    SagaCompleted,
    SagaFailed,
    SagaParked,
    SagaResumed,
    StepSkipped,
    TimerFired,
)
from saga_engine.core.history._status import TRANSITIONS, SagaStatus
from tests.internal.property.sagas import StepSpec

S = SagaStatus


# --------------------------------------------------------------------------- status


def _releases(event: StepSkipped | RetryRequested, held: set[str]) -> bool:
    """Whether ``event`` answers a held step: an operator's skip of it, or a retry
    (recorded only when the code running then accepted the held reply)."""
    compensation = isinstance(event, StepSkipped) and event.compensation
    return not compensation and event.step in held


def held_after_each(history: list[Event]) -> list[frozenset[str]]:
    """The steps whose reply is held, after each event of the history."""
    held: set[str] = set()
    out: list[frozenset[str]] = []
    for event in history:
        if isinstance(event, InvalidReplyReceived):
            held.add(event.step)
        elif isinstance(event, StepSkipped | RetryRequested) and _releases(event, held):
            held.discard(event.step)
        elif isinstance(event, CompensationStarted | SagaCompleted | SagaFailed | SagaCancelled):
            held.clear()  # the run is over: its held steps were stopped with it
        out.append(frozenset(held))
    return out


def status_transitions(history: list[Event]) -> tuple[list[tuple[int, S, S]], S]:
    """Folds the history into statuses: every change (index, from, to), and the last status."""
    under, parked = S.RUNNING, False
    held: set[str] = set()
    changes: list[tuple[int, S, S]] = []
    ends: dict[type, S] = {
        SagaCompleted: S.COMPLETED,
        SagaFailed: S.FAILED,
        SagaCompensated: S.COMPENSATED,
        SagaCancelled: S.CANCELLED,
    }
    for i, event in enumerate(history):
        old = S.NONDETERMINISTIC if parked else under
        if isinstance(event, CompensationStarted):
            under = S.COMPENSATING
        elif isinstance(event, CompensationStuck):
            under = S.COMPENSATION_STUCK
        elif isinstance(event, InvalidReplyReceived):
            held.add(event.step)
            under = S.STEP_STUCK
        elif isinstance(event, StepSkipped | RetryRequested) and _releases(event, held):
            held.discard(event.step)
            if not held and under == S.STEP_STUCK:
                under = S.RUNNING
        elif isinstance(event, SagaParked):
            parked = True
        elif isinstance(event, SagaResumed):
            nxt = history[i + 1] if i + 1 < len(history) else None
            # An operator's resume retries a stuck compensation. One that lifts a
            # nondeterministic park may also do so (then a compensation follows at
            # once) or only unpark, leaving the saga stuck until the next resume.
            retries = not parked or isinstance(nxt, CompensationIssued)
            if retries and under == S.COMPENSATION_STUCK:
                under = S.COMPENSATING
            parked = False
        elif type(event) in ends:
            under = ends[type(event)]
        if isinstance(event, CompensationStarted) or type(event) in ends:
            held.clear()
        new = S.NONDETERMINISTIC if parked else under
        if new != old:
            changes.append((i, old, new))
    return changes, S.NONDETERMINISTIC if parked else under


def statuses_after_each(history: list[Event]) -> list[S]:
    """The folded status after each event of the history (index i: after event i)."""
    changes, _ = status_transitions(history)
    at = {i: new for i, _, new in changes}
    status, out = S.RUNNING, []
    for i in range(len(history)):
        status = at.get(i, status)
        out.append(status)
    return out


def reachable(src: S, dst: S) -> bool:
    """Whether TRANSITIONS allows getting from src to dst in zero or more moves."""
    seen, todo = {src}, [src]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return dst in seen


# --------------------------------------------------------------------------- compensation


@dataclass
class _Forward:
    first_issue: int
    attempt: int = 0
    in_flight: bool = False
    #: The outcome of the current command id is unknown (an attempt timed out and no
    #: reply for that id said otherwise since).
    unknown: bool = False
    #: Its success reply was held (refused by the step's model): applied, still waiting.
    held: bool = False
    finished: bool = False
    outcome: str = ""
    #: Where it was owed (applied, or given up in doubt, or stopped with the run).
    owed_at: int | None = None


@dataclass
class CompensationReport:
    """What the oracle found; ``problems`` is empty when the history is right."""

    problems: list[str] = field(default_factory=list)
    #: Owed compensations, last owed first, as compensation_started lists them (None:
    #: compensation never began).
    expected_owed: list[str] | None = None
    #: The steps whose compensation was sent, first attempt only, in order.
    compensated: list[str] = field(default_factory=list)
    #: Per owed step, the owed steps that came after it (began after it was owed): the
    #: compensations that must complete before its own is sent.
    undo_after: dict[str, set[str]] = field(default_factory=dict)
    #: Where each step's compensation was first sent, and where it completed.
    undo_sent_at: dict[str, int] = field(default_factory=dict)
    undo_done_at: dict[str, int] = field(default_factory=dict)
    refused_steps: list[str] = field(default_factory=list)
    #: Steps whose reply was held, and those an operator (or a retry) then released.
    held_steps: list[str] = field(default_factory=list)
    released_steps: list[str] = field(default_factory=list)
    #: Steps an operator answered while their participant had not: never compensated.
    skipped_steps: list[str] = field(default_factory=list)
    #: Held steps still waiting when the run was stopped (cancel, deadline, failure).
    stopped_while_held: list[str] = field(default_factory=list)


#: What a run that ends in error because a step failed names as its error.
_STEP_ERRORS = ("StepFailed", "StepTimedOut")
_CAUSE_ERRORS = {
    "cancel": "SagaCancelled",
    "deadline": "DeadlineExceeded",
    "operator": "OperatorForcedCompensation",
}


def check_compensations(history: list[Event], steps: dict[str, StepSpec]) -> CompensationReport:
    """Compensations run only for (possibly) applied steps, each after the compensations
    of every step that began after it was applied (``core/runtime/_undo``).

    A forward step is owed its compensation (if it has one) when it got a success
    reply, when its last attempt timed out (outcome unknown), or when the run stopped
    (failure elsewhere, cancel, deadline) while the step's outcome was open: a command
    in flight, or a timed-out attempt awaiting its retry. Steps applied one by one are
    owed in the order they were applied; steps stopped together are owed after them,
    in the order they started (their tasks are cancelled in that order). Compensation
    runs the owed list backwards.

    Held replies: a step whose success reply was held is applied but still waiting. When
    released (skip, accepted retry) it is applied at that point; stopped while held, it
    is stopped together with the steps in flight. A step an operator skipped while its
    participant had not answered is never compensated. Nothing reacts to a held reply
    (the next event is an input), and a run that fails (reason ``failure``) names a step
    that really failed (refused, gave up, timed out), never a held one.
    """
    report = CompensationReport()
    problems = report.problems
    forward: dict[str, _Forward] = {}
    applied: list[str] = []
    ended_run = False
    cause = "failure"

    def check_failure(i: int, what: str, error: ErrorInfo | None) -> None:
        """The run ended in error on its own: a step must really have failed."""
        if error is None:
            problems.append(f"#{i + 1}: {what} without an error")
            return
        f = forward.get(error.step or "")
        real = f is not None and f.finished and f.outcome in ("failure", "retryable", "timed_out")
        if error.type not in _STEP_ERRORS or not real or f is None or f.held:
            problems.append(
                f"#{i + 1}: {what} for {error.type} on step {error.step!r} "
                f"({f.outcome if f else 'never issued'}), not a step that failed: {error.message}"
            )

    def release(i: int, event: StepSkipped | RetryRequested, f: _Forward) -> None:
        if ended_run:
            problems.append(f"#{i + 1}: {event.kind} of {event.step!r} after the run ended")
        f.in_flight = f.held = False
        f.finished, f.outcome = True, "success"
        report.released_steps.append(event.step)
        if steps[event.step].compensate:
            applied.append(event.step)
            f.owed_at = i

    def stopped_together() -> list[str]:
        open_steps = [
            (f.first_issue, name)
            for name, f in forward.items()
            if not f.finished and (f.in_flight or f.unknown) and steps[name].compensate
        ]
        return [name for _, name in sorted(open_steps)]

    for i, event in enumerate(history):
        if i > 0 and isinstance(history[i - 1], InvalidReplyReceived) and event.is_intent:
            problems.append(f"#{i + 1}: {event.kind} in reaction to a held reply")
        if isinstance(event, CommandIssued):
            if ended_run:
                problems.append(f"#{i + 1}: forward command for {event.step!r} after the run ended")
            f = forward.setdefault(event.step, _Forward(first_issue=i))
            f.attempt, f.in_flight = event.attempt, True
        elif isinstance(event, InvalidReplyReceived):
            f = forward[event.step]
            if not f.in_flight or f.held or f.finished:
                problems.append(f"#{i + 1}: a reply held for {event.step!r}, not waiting for one")
            f.held = True
            report.held_steps.append(event.step)
        elif isinstance(event, StepSkipped) and not event.compensation:
            f = forward[event.step]
            if f.held:
                release(i, event, f)
            elif not f.in_flight or f.finished or ended_run:
                problems.append(f"#{i + 1}: {event.step!r} skipped while not waiting for a reply")
            else:
                # Done by hand: the operator took responsibility; nothing is owed for it.
                f.in_flight, f.finished, f.outcome = False, True, "skipped"
                report.skipped_steps.append(event.step)
        elif isinstance(event, RetryRequested) and event.step in forward:
            f = forward[event.step]
            if f.held:
                release(i, event, f)
        elif isinstance(event, ReplyReceived | AttemptTimedOut) and not event.compensation:
            f = forward[event.step]
            if f.held:
                problems.append(f"#{i + 1}: {event.kind} for {event.step!r}, whose reply is held")
            f.in_flight = False
            last = f.attempt >= steps[event.step].attempts
            if isinstance(event, AttemptTimedOut):
                f.unknown = True
                if last:
                    f.finished, f.outcome = True, "timed_out"
                    if steps[event.step].compensate:
                        applied.append(event.step)
                        f.owed_at = i
            elif event.outcome == "success":
                f.finished, f.outcome = True, "success"
                if steps[event.step].compensate:
                    applied.append(event.step)
                    f.owed_at = i
            elif event.outcome == "failure":
                f.finished, f.outcome = True, "failure"
                report.refused_steps.append(event.step)
            else:
                f.unknown = False  # a new command id next: nothing was applied under this one
                if last:
                    f.finished, f.outcome = True, "retryable"
                    report.refused_steps.append(event.step)
        elif isinstance(event, CancelRequested):
            cause = "cancel" if cause == "failure" else cause
        elif isinstance(event, CompensationForced):
            cause = "operator" if cause == "failure" else cause
        elif isinstance(event, TimerFired) and event.timer_id == DEADLINE_TIMER:
            cause = "deadline" if cause == "failure" else cause
        elif isinstance(event, CompensationStarted):
            if ended_run:
                problems.append(f"#{i + 1}: a second compensation_started")
            ended_run = True
            report.stopped_while_held = [n for n, f in forward.items() if f.held]
            if cause == "failure":
                check_failure(i, "compensation_started", event.error)
            elif event.error is None or event.error.type != _CAUSE_ERRORS[cause]:
                problems.append(f"#{i + 1}: compensation for {event.error} after {cause}")
            for name in stopped_together():
                forward[name].owed_at = i
            owed = applied + stopped_together()
            report.expected_owed = list(reversed(owed))
            report.undo_after = {
                x: {
                    y for y in owed if y != x and (forward[x].owed_at or 0) < forward[y].first_issue
                }
                for x in owed
            }
            if event.owed != report.expected_owed:
                problems.append(
                    f"#{i + 1}: compensation_started owes {event.owed}, expected "
                    f"{report.expected_owed} (applied in order {applied}, stopped together "
                    f"{stopped_together()})"
                )
            if event.reason != cause:
                problems.append(f"#{i + 1}: compensation reason {event.reason}, expected {cause}")
            for f in forward.values():
                f.held = False  # stopped with the run: owed above, answered by nothing now
        elif isinstance(event, CompensationIssued):
            if report.expected_owed is None:
                problems.append(f"#{i + 1}: compensation of {event.step!r} before compensating")
            if event.attempt == 1:
                report.compensated.append(event.step)
                report.undo_sent_at.setdefault(event.step, i)
        elif isinstance(event, CompensationCompleted) or (
            isinstance(event, StepSkipped) and event.compensation
        ):
            report.undo_done_at.setdefault(event.step, i)
        elif isinstance(event, SagaCompleted):
            ended_run = True
            if any(f.held for f in forward.values()):
                problems.append(f"#{i + 1}: completed while a step's reply is held")
            if report.compensated or report.expected_owed is not None:
                problems.append(f"#{i + 1}: a completed saga compensated {report.compensated}")
        elif isinstance(event, SagaFailed | SagaCancelled | SagaCompensated):
            if not ended_run:
                ended_run = True
                report.stopped_while_held = [n for n, f in forward.items() if f.held]
                if isinstance(event, SagaFailed) and cause == "failure":
                    check_failure(i, "saga_failed", event.error)
                elif isinstance(event, SagaFailed) and event.error.type != _CAUSE_ERRORS[cause]:
                    problems.append(f"#{i + 1}: saga_failed for {event.error.type} after {cause}")
                owed = applied + stopped_together()
                if owed:
                    problems.append(
                        f"#{i + 1}: {event.kind} without compensating {list(reversed(owed))}"
                    )
            if isinstance(event, SagaCancelled) != (cause == "cancel"):
                problems.append(f"#{i + 1}: {event.kind} after a run ended by {cause}")
            if isinstance(event, SagaCompensated) and sorted(report.compensated) != sorted(
                report.expected_owed or []
            ):
                problems.append(
                    f"#{i + 1}: saga_compensated after compensating {report.compensated}, "
                    f"owed {report.expected_owed}"
                )

    for step, sent_at in report.undo_sent_at.items():
        for later in report.undo_after.get(step, ()):
            done = report.undo_done_at.get(later)
            if done is None or done > sent_at:
                problems.append(
                    f"compensation of {step!r} sent before that of {later!r} (which began "
                    f"after {step!r} was applied) completed"
                )
    for step in report.compensated:
        if not steps[step].compensate:
            problems.append(f"step {step!r} has no compensation but was compensated")
        if step in report.refused_steps:
            problems.append(f"step {step!r} was refused (nothing applied) but was compensated")
        if step in report.skipped_steps:
            problems.append(f"step {step!r} was skipped unanswered but was compensated")
    completed = [e.step for e in history if isinstance(e, CompensationCompleted)]
    if len(set(completed)) != len(completed) or not set(completed) <= set(report.compensated):
        problems.append(f"compensations completed {completed}, sent {report.compensated}")
    return report

"""Independent oracles: what a history *should* contain, computed from the events alone.

They use the saga's static step table, never the runtime's own bookkeeping (its stack
of owed compensations, its status), so they can catch the runtime contradicting itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from saga_engine._decision import DEADLINE_TIMER
from saga_engine._events import (
    AttemptTimedOut,
    CancelRequested,
    CommandIssued,
    CompensationCompleted,
    CompensationIssued,
    CompensationStarted,
    CompensationStuck,
    Event,
    ReplyReceived,
    SagaCancelled,
    SagaCompensated,
    SagaCompleted,
    SagaFailed,
    SagaParked,
    SagaResumed,
    TimerFired,
)
from saga_engine._status import TRANSITIONS, SagaStatus
from tests.property.sagas import StepSpec

S = SagaStatus


# --------------------------------------------------------------------------- status


def status_transitions(history: list[Event]) -> tuple[list[tuple[int, S, S]], S]:
    """Folds the history into statuses: every change (index, from, to), and the last status."""
    under, parked = S.RUNNING, False
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
        new = S.NONDETERMINISTIC if parked else under
        if new != old:
            changes.append((i, old, new))
    return changes, S.NONDETERMINISTIC if parked else under


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
    finished: bool = False
    outcome: str = ""


@dataclass
class CompensationReport:
    """What the oracle found; ``problems`` is empty when the history is right."""

    problems: list[str] = field(default_factory=list)
    #: Owed compensations, in the order they must run (None: compensation never began).
    expected_owed: list[str] | None = None
    #: The steps whose compensation was sent, first attempt only, in order.
    compensated: list[str] = field(default_factory=list)
    refused_steps: list[str] = field(default_factory=list)


def check_compensations(history: list[Event], steps: dict[str, StepSpec]) -> CompensationReport:
    """Compensations run only for (possibly) applied steps, last applied first.

    A forward step is owed its compensation (if it has one) when it got a success
    reply, when its last attempt timed out (outcome unknown), or when the run stopped
    (failure elsewhere, cancel, deadline) while the step's outcome was open: a command
    in flight, or a timed-out attempt awaiting its retry. Steps applied one by one are
    owed in the order they were applied; steps stopped together are owed after them,
    in the order they started (their tasks are cancelled in that order). Compensation
    runs the owed list backwards.
    """
    report = CompensationReport()
    problems = report.problems
    forward: dict[str, _Forward] = {}
    applied: list[str] = []
    ended_run = False
    cause = "failure"

    def stopped_together() -> list[str]:
        open_steps = [
            (f.first_issue, name)
            for name, f in forward.items()
            if not f.finished and (f.in_flight or f.unknown) and steps[name].compensate
        ]
        return [name for _, name in sorted(open_steps)]

    for i, event in enumerate(history):
        if isinstance(event, CommandIssued):
            if ended_run:
                problems.append(f"#{i + 1}: forward command for {event.step!r} after the run ended")
            f = forward.setdefault(event.step, _Forward(first_issue=i))
            f.attempt, f.in_flight = event.attempt, True
        elif isinstance(event, ReplyReceived | AttemptTimedOut) and not event.compensation:
            f = forward[event.step]
            f.in_flight = False
            last = f.attempt >= steps[event.step].attempts
            if isinstance(event, AttemptTimedOut):
                f.unknown = True
                if last:
                    f.finished, f.outcome = True, "timed_out"
                    if steps[event.step].compensate:
                        applied.append(event.step)
            elif event.outcome == "success":
                f.finished, f.outcome = True, "success"
                if steps[event.step].compensate:
                    applied.append(event.step)
            elif event.outcome == "failure":
                f.finished, f.outcome = True, "failure"
                report.refused_steps.append(event.step)
            else:
                f.unknown = False  # a new command id next: nothing was applied under this one
                if last:
                    f.finished, f.outcome = True, "retryable"
                    report.refused_steps.append(event.step)
        elif isinstance(event, CancelRequested):
            cause = "cancel"
        elif isinstance(event, TimerFired) and event.timer_id == DEADLINE_TIMER:
            cause = "deadline" if cause == "failure" else cause
        elif isinstance(event, CompensationStarted):
            if ended_run:
                problems.append(f"#{i + 1}: a second compensation_started")
            ended_run = True
            owed = applied + stopped_together()
            report.expected_owed = list(reversed(owed))
            if event.owed != report.expected_owed:
                problems.append(
                    f"#{i + 1}: compensation_started owes {event.owed}, expected "
                    f"{report.expected_owed} (applied in order {applied}, stopped together "
                    f"{stopped_together()})"
                )
            if event.reason != cause:
                problems.append(f"#{i + 1}: compensation reason {event.reason}, expected {cause}")
        elif isinstance(event, CompensationIssued):
            if report.expected_owed is None:
                problems.append(f"#{i + 1}: compensation of {event.step!r} before compensating")
            if event.attempt == 1:
                report.compensated.append(event.step)
        elif isinstance(event, SagaCompleted):
            ended_run = True
            if report.compensated or report.expected_owed is not None:
                problems.append(f"#{i + 1}: a completed saga compensated {report.compensated}")
        elif isinstance(event, SagaFailed | SagaCancelled | SagaCompensated):
            if not ended_run:
                ended_run = True
                owed = applied + stopped_together()
                if owed:
                    problems.append(
                        f"#{i + 1}: {event.kind} without compensating {list(reversed(owed))}"
                    )
            if isinstance(event, SagaCancelled) != (cause == "cancel"):
                problems.append(f"#{i + 1}: {event.kind} after a run ended by {cause}")
            if isinstance(event, SagaCompensated) and report.compensated != report.expected_owed:
                problems.append(
                    f"#{i + 1}: saga_compensated after compensating {report.compensated}, "
                    f"owed {report.expected_owed}"
                )

    owed_order = report.expected_owed or []
    if report.compensated != owed_order[: len(report.compensated)]:
        problems.append(f"compensations sent for {report.compensated}, expected order {owed_order}")
    for step in report.compensated:
        if not steps[step].compensate:
            problems.append(f"step {step!r} has no compensation but was compensated")
        if step in report.refused_steps:
            problems.append(f"step {step!r} was refused (nothing applied) but was compensated")
    completed = [e.step for e in history if isinstance(e, CompensationCompleted)]
    if completed != report.compensated[: len(completed)]:
        problems.append(f"compensations completed {completed}, sent {report.compensated}")
    return report

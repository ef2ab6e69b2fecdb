"""What the API shows about a saga, computed from its record and its history."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from saga_engine._events import (
    AttemptTimedOut,
    CommandIssued,
    CompensationCompleted,
    CompensationIssued,
    CompensationSpec,
    CompensationStarted,
    CompensationStuck,
    Event,
    InvalidReplyReceived,
    ReplyReceived,
    SagaCompleted,
    SagaStarted,
)
from saga_engine._status import SagaStatus
from saga_engine._store import SagaRecord
from saga_engine.admin.schemas import PendingCompensation, SagaDetail, SagaSummary


def summary(record: SagaRecord) -> SagaSummary:
    return SagaSummary(
        saga_id=record.saga_id,
        saga_type=record.saga_type,
        status=record.status,
        current_step=record.current_step,
        next_wakeup=record.next_wakeup,
        error=record.error,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )


def detail(record: SagaRecord, events: Sequence[Event]) -> SagaDetail:
    started = next((e for e in events if isinstance(e, SagaStarted)), None)
    completed = next((e for e in reversed(events) if isinstance(e, SagaCompleted)), None)
    return SagaDetail(
        **summary(record).model_dump(),
        input=started.input if started else {},
        output=completed.output if completed else None,
        pending_compensations=pending_compensations(record.status, events),
        deadline_at=started.deadline_at if started else None,
        idempotency_key=record.idempotency_key,
        events=len(events),
    )


@dataclass(slots=True)
class _Step:
    spec: CompensationSpec | None = None
    #: in_flight, waiting (to retry), applied, refused or skipped
    forward: str = "in_flight"
    #: an attempt timed out since the last retryable reply: it may have been applied
    unknown: bool = False
    attempts: int = 0
    last_error: str | None = None
    compensating: bool = False
    stuck: bool = False
    done: bool = False
    #: Its success reply was held as invalid: the participant applied it.
    held: bool = False

    @property
    def in_doubt(self) -> bool:
        return self.forward == "in_flight" or (self.forward == "waiting" and self.unknown)


def pending_compensations(status: SagaStatus, events: Sequence[Event]) -> list[PendingCompensation]:
    """The compensations still owed, in the order they would run (last in, first out).

    Before compensation begins, the stack is the applied steps that carry a compensation,
    newest first, preceded by steps whose outcome is still unknown (in flight, or timed
    out and waiting to retry): a cancel now would owe theirs too. Once compensation
    begins, ``compensation_started`` names the owed steps; ``compensation_completed`` (or
    an operator's skip) takes one off.
    """
    if status.is_terminal:
        return []
    steps: dict[str, _Step] = {}
    applied: list[str] = []  # in the order they were applied
    owed_at_start: list[str] | None = None
    for event in events:
        if isinstance(event, CommandIssued):
            step = steps.setdefault(event.step, _Step())
            step.spec = event.compensation or step.spec
            step.forward = "in_flight"
        elif isinstance(event, ReplyReceived):
            step = steps.setdefault(event.step, _Step())
            if event.compensation:
                if event.outcome != "success":
                    step.last_error = event.error or event.outcome
            elif event.outcome == "success":
                step.forward = "applied"
                if event.step not in applied:
                    applied.append(event.step)
            elif event.outcome == "failure":
                step.forward = "refused"
            else:  # retryable: the participant applied nothing
                step.forward, step.unknown = "waiting", False
        elif isinstance(event, InvalidReplyReceived):
            step = steps.setdefault(event.step, _Step())
            step.forward, step.held = "applied", True
            step.last_error = event.error.message
            if event.step not in applied:
                applied.append(event.step)
        elif isinstance(event, AttemptTimedOut):
            step = steps.setdefault(event.step, _Step())
            if event.compensation:
                step.last_error = "timed out"
            else:
                step.forward, step.unknown = "waiting", True
        elif isinstance(event, CompensationStarted):
            owed_at_start = list(event.owed)
        elif isinstance(event, CompensationIssued):
            step = steps.setdefault(event.step, _Step())
            step.compensating, step.stuck = True, False
            step.attempts += 1
        elif isinstance(event, CompensationStuck):
            step = steps.setdefault(event.step, _Step())
            step.stuck, step.last_error = True, event.error.message
        elif isinstance(event, CompensationCompleted):
            steps.setdefault(event.step, _Step()).done = True
        elif event.kind == "step_skipped":  # an operator answered in the participant's place
            name = str(getattr(event, "step", ""))
            step = steps.setdefault(name, _Step())
            if getattr(event, "compensation", False):
                step.done = True
            elif not step.held:  # a held step was applied by its participant: still owed
                step.forward = "skipped"
                if name in applied:
                    applied.remove(name)
    out: list[PendingCompensation] = []
    if owed_at_start is not None:
        for name in owed_at_start:
            step = steps.get(name, _Step())
            if not step.done:
                state = (
                    "stuck" if step.stuck else "compensating" if step.compensating else "pending"
                )
                out.append(_pending(name, step, state))
        return out
    doubtful = [n for n, s in steps.items() if s.spec is not None and s.in_doubt]
    out.extend(_pending(n, steps[n], "in_doubt") for n in reversed(doubtful))
    out.extend(
        _pending(n, steps[n], "owed")
        for n in reversed(applied)
        if steps[n].spec is not None and steps[n].forward == "applied"
    )
    return out


def _pending(name: str, step: _Step, state: Any) -> PendingCompensation:
    spec = step.spec
    return PendingCompensation(
        step=name,
        participant=spec.participant if spec else "",
        command_type=spec.command_type if spec else "",
        payload=dict(spec.payload) if spec else {},
        state=state,
        attempts=step.attempts,
        last_error=step.last_error,
    )

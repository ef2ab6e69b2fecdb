"""One fold of a saga's history into what an operator needs to see: a :class:`SagaView`.

Pure (no I/O, no clock): the admin API, the web page and the CLI all show a saga through
this fold, so a rule about compensation or waiting is written here once. The runtime
drives the saga; this reads what it recorded. ``tests/internal/property/test_view.py`` runs
generated sagas and checks, after every input, that the fold of the history agrees with
the runtime's own state (status, error, commands in flight, timers, owed compensations).

One thing a history cannot say: a wait for a signal *without* a timeout records nothing
(only a timed wait records its timer). The caller that knows (the live or replayed
runtime) passes those names in ``awaited_signals``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from saga_engine.core._decision import DEADLINE_TIMER
from saga_engine.core._events import (
    AttemptTimedOut,
    CancelRequested,
    CommandIssued,
    CompensationCompleted,
    CompensationForced,
    CompensationIssued,
    CompensationSpec,
    CompensationStarted,
    CompensationStuck,
    ErrorInfo,
    Event,
    InvalidReplyReceived,
    ReplyReceived,
    RetryRequested,
    SagaCompleted,
    SagaFailed,
    SagaParked,
    SagaResumed,
    SagaStarted,
    SignalReceived,
    StepSkipped,
    TimerFired,
    TimerStarted,
    UndoRequested,
)
from saga_engine.core._status import SagaStatus
from saga_engine.kernel._serde import JsonDict


class WaitKind(StrEnum):
    """What kind of thing a saga waits for."""

    REPLY = "reply"  #: a participant's answer to a command sent
    SIGNAL = "signal"  #: a named signal (with a deadline if the wait has a timeout)
    TIMER = "timer"  #: a durable sleep
    BACKOFF = "backoff"  #: the pause before a step's (or compensation's) next attempt
    OPERATOR = "operator"  #: a human: a held reply, a stuck compensation, a parked saga


class OwedState(StrEnum):
    OWED = "owed"  #: applied; undone if the saga fails or is cancelled
    IN_DOUBT = "in_doubt"  #: outcome unknown (in flight or timed out): owed if it stops now
    PENDING = "pending"  #: compensation begun, this one not sent yet
    COMPENSATING = "compensating"  #: sent, awaiting its reply
    STUCK = "stuck"  #: exhausted its retries: an operator retries, skips or resumes


class Lane(StrEnum):
    """The timeline's kinds of row."""

    STEP = "step"
    COMPENSATION = "compensation"
    WAIT = "wait"
    PARKED = "parked"


@dataclass(frozen=True, slots=True)
class Wait:
    kind: WaitKind
    #: A sentence: "a reply to step 'charge' (attempt 2) from 'payments'".
    what: str
    since: datetime
    #: When it ends on its own: the attempt's timeout, the signal's deadline, the timer.
    until: datetime | None = None
    step: str | None = None
    #: The signal's name, or the timer's id.
    name: str | None = None
    attempt: int | None = None
    compensation: bool = False


@dataclass(frozen=True, slots=True)
class InFlight:
    """A command sent and not answered (or answered with a reply held as invalid)."""

    step: str
    command_id: str
    attempt: int
    participant: str
    command_type: str
    compensation: bool
    since: datetime
    timeout_at: datetime | None
    #: Its success reply did not match the step's model: it waits for an operator.
    held: ErrorInfo | None = None


@dataclass(frozen=True, slots=True)
class PendingTimer:
    timer_id: str
    #: sleep, retry, signal_timeout or deadline
    purpose: str
    fire_at: datetime
    since: datetime


@dataclass(frozen=True, slots=True)
class Owed:
    step: str
    participant: str
    command_type: str
    payload: JsonDict
    state: OwedState
    attempts: int = 0
    last_error: str | None = None


@dataclass(slots=True)
class Segment:
    """One stretch of the timeline: an attempt, a back-off, a wait, a parked period."""

    row: str
    lane: Lane
    label: str
    start: datetime
    start_seq: int
    #: success, refused, failed, retryable, timed_out, invalid, in_doubt, pending,
    #: skipped, backoff, waiting, fired, received, timed_out, cancelled, parked, resumed
    outcome: str = "pending"
    end: datetime | None = None
    end_seq: int | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Action:
    """An operator action the saga accepts now, and the steps it applies to (if any)."""

    name: str  #: signal, cancel, force-compensate, resume, retry or skip
    steps: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SagaView:
    saga_id: str
    saga_type: str
    status: SagaStatus
    error: ErrorInfo | None
    current_step: str | None
    input: JsonDict
    output: JsonDict | None
    deadline_at: datetime | None
    idempotency_key: str | None
    in_flight: tuple[InFlight, ...]
    timers: tuple[PendingTimer, ...]
    owed: tuple[Owed, ...]
    #: The compensation that exhausted its retries (while compensation_stuck).
    stuck_step: str | None
    waiting_for: tuple[Wait, ...]
    segments: tuple[Segment, ...]
    #: What an operator can do now (what the engine would not refuse as a 409).
    actions: tuple[Action, ...]
    events: int
    started_at: datetime | None
    last_at: datetime | None


_TERMINAL = {
    "saga_completed": SagaStatus.COMPLETED,
    "saga_failed": SagaStatus.FAILED,
    "saga_compensated": SagaStatus.COMPENSATED,
    "saga_cancelled": SagaStatus.CANCELLED,
}


@dataclass(slots=True)
class _Step:
    spec: CompensationSpec | None = None
    #: in_flight, waiting (to retry), applied, refused or skipped
    forward: str = "in_flight"
    #: an attempt timed out since the last retryable reply: it may have been applied
    unknown: bool = False
    comp_attempts: int = 0
    last_error: str | None = None
    compensating: bool = False
    done: bool = False
    #: its success reply was held as invalid: the participant applied it
    held: bool = False

    @property
    def in_doubt(self) -> bool:
        return self.forward == "in_flight" or (self.forward == "waiting" and self.unknown)


class _Fold:
    """The state the fold carries from one event to the next."""

    def __init__(self) -> None:
        self.saga_id = ""
        self.saga_type = ""
        self.started: SagaStarted | None = None
        self.base = SagaStatus.RUNNING  # the status the saga's own events reached
        self.parked = False
        self.error: ErrorInfo | None = None
        #: Why it compensates: compensation_started's error.
        self.cause: ErrorInfo | None = None
        self.current_step: str | None = None
        self.output: JsonDict | None = None
        self.inflight: dict[str, InFlight] = {}
        self.timers: dict[str, PendingTimer] = {}
        self.steps: dict[str, _Step] = {}
        self.applied: list[str] = []  # applied forward steps, in order
        self.owed_at_start: list[str] | None = None
        self.stuck_step: str | None = None
        self.segments: list[Segment] = []
        self.open: dict[str, Segment] = {}  # command id or timer id -> open segment
        self.parked_segment: Segment | None = None
        #: A forward step whose attempt just timed out (see _after_timeout).
        self.timed_out: str | None = None
        #: A cancel, a forced compensation or the deadline stopped the run.
        self.stopping = False

    # ------------------------------------------------------------------ the fold

    def apply(self, seq: int, event: Event) -> None:
        if self.timed_out is not None:
            self._after_timeout(event)
        if isinstance(event, SagaStarted):
            self.started, self.saga_type = event, event.saga_type
            if event.deadline_at is not None:
                self.timers[DEADLINE_TIMER] = PendingTimer(
                    DEADLINE_TIMER, "deadline", event.deadline_at, event.at
                )
        elif isinstance(event, CommandIssued | CompensationIssued):
            self._issued(seq, event)
        elif isinstance(event, ReplyReceived):
            self._replied(seq, event)
        elif isinstance(event, InvalidReplyReceived):
            sent = self.inflight.get(event.command_id)
            if sent is not None:
                self.inflight[event.command_id] = _replace_held(sent, event.error)
                self.timers.pop(_timeout_id(sent), None)
            s = self._step(event.step)
            # Applied by the participant, but the saga's stack takes it only once an
            # operator releases it (or the run stops while it is held).
            s.forward, s.held, s.last_error = "held", True, event.error.message
            self.base, self.error = SagaStatus.STEP_STUCK, event.error
            self._settle_held()  # with several held, the first one's error is reported
            self._close(event.command_id, "invalid", event, seq, event.error.message)
        elif isinstance(event, AttemptTimedOut):
            sent = self.inflight.pop(event.command_id, None)
            if sent is not None:
                self.timers.pop(_timeout_id(sent), None)
            s = self._step(event.step)
            if event.compensation:
                s.last_error = "timed out"
            else:
                s.forward, s.unknown = "waiting", True
                self.timed_out = event.step
            self._close(event.command_id, "timed_out", event, seq, "timed out")
        elif isinstance(event, TimerStarted):
            self.timers[event.timer_id] = PendingTimer(
                event.timer_id, event.purpose, event.fire_at, event.at
            )
            self._timer_segment(seq, event)
        elif isinstance(event, CancelRequested | CompensationForced):
            self.stopping = True
        elif isinstance(event, UndoRequested):
            # Its parent compensates: a running child stops as on a cancel; a completed
            # one compensates next (its compensation_started follows).
            self.stopping = self.stopping or self.base != SagaStatus.COMPLETED
        elif isinstance(event, TimerFired):
            self.stopping = self.stopping or event.timer_id == DEADLINE_TIMER
            self.timers.pop(event.timer_id, None)
            segment = self.open.get(event.timer_id)
            outcome = "timed_out" if event.timer_id.startswith("signal:") else "fired"
            if segment is not None and segment.outcome == "backoff":
                outcome = "backoff"
            self._close(event.timer_id, outcome, event, seq)
        elif isinstance(event, SignalReceived):
            for timer_id in [t for t in self.timers if _signal_of(t) == event.name][:1]:
                self.timers.pop(timer_id)
                self._close(timer_id, "received", event, seq, event.principal)
        elif isinstance(event, CompensationStarted):
            self.base, self.error, self.cause = SagaStatus.COMPENSATING, event.error, event.error
            self.owed_at_start = list(event.owed)
            self._stop_forward(seq, event)
        elif isinstance(event, CompensationStuck):
            self.base, self.error, self.stuck_step = (
                SagaStatus.COMPENSATION_STUCK, event.error, event.step,
            )  # fmt: skip
        elif isinstance(event, CompensationCompleted):
            self._step(event.step).done = True
        elif isinstance(event, StepSkipped):
            self._skipped(seq, event)
        elif isinstance(event, RetryRequested):
            self._retry(seq, event)
        elif isinstance(event, SagaParked):
            self.parked, self.error = True, event.error
            self.parked_segment = Segment(
                "parked", Lane.PARKED, f"parked ({event.reason})", event.at, seq, "parked",
                detail=event.error.message,
            )  # fmt: skip
            self.segments.append(self.parked_segment)
        elif isinstance(event, SagaResumed):
            self.parked = False
            if self.base == SagaStatus.COMPENSATION_STUCK:
                self.base, self.stuck_step = SagaStatus.COMPENSATING, None
            # What parked it is over: the saga reports the error of where it goes back
            # to (why it compensates, or a held reply's), until a new one.
            self.error = self.cause if self.base == SagaStatus.COMPENSATING else None
            self._settle_held()
            if self.parked_segment is not None and self.parked_segment.end is None:
                _end(self.parked_segment, "resumed", event.at, seq, event.principal)
        elif event.kind in _TERMINAL:
            self.base = _TERMINAL[event.kind]
            if isinstance(event, SagaCompleted):
                self.output = event.output
                self.error = None
            elif isinstance(event, SagaFailed):
                self.error = event.error
            # (compensated, cancelled: the error compensation began with stands)
            self.inflight.clear()
            self.timers.clear()
            for key in list(self.open):
                self._close(key, "cancelled", event, seq)

    def _step(self, name: str) -> _Step:
        found = self.steps.get(name)
        if found is None:
            found = self.steps[name] = _Step()
        return found

    def _issued(self, seq: int, event: CommandIssued | CompensationIssued) -> None:
        comp = isinstance(event, CompensationIssued)
        self.current_step = event.step
        self.inflight[event.command_id] = InFlight(
            event.step, event.command_id, event.attempt, event.participant,
            event.command_type, comp, event.at, event.timeout_at,
        )  # fmt: skip
        if event.timeout_at is not None:
            timer_id = f"timeout:{event.command_id}:{event.attempt}"
            self.timers[timer_id] = PendingTimer(timer_id, "timeout", event.timeout_at, event.at)
        s = self._step(event.step)
        if isinstance(event, CommandIssued):
            s.spec = event.compensation or s.spec
            s.forward = "in_flight"
        else:
            s.compensating = True
            s.comp_attempts += 1
        lane = Lane.COMPENSATION if comp else Lane.STEP
        segment = Segment(
            event.step, lane, f"{'undo ' if comp else ''}{event.step} #{event.attempt}",
            event.at, seq, detail=f"{event.command_type} → {event.participant}",
        )  # fmt: skip
        self.segments.append(segment)
        self.open[event.command_id] = segment

    def _replied(self, seq: int, event: ReplyReceived) -> None:
        sent = self.inflight.pop(event.command_id, None)
        if sent is not None:
            self.timers.pop(_timeout_id(sent), None)
        s = self._step(event.step)
        if event.compensation:
            if event.outcome != "success":
                s.last_error = event.error or event.outcome
        elif event.outcome == "success":
            s.forward = "applied"
            if event.step not in self.applied:
                self.applied.append(event.step)
        elif event.outcome == "failure":
            s.forward = "refused"
        else:  # retryable: the participant applied nothing
            s.forward, s.unknown = "waiting", False
        outcome = {"success": "success", "failure": "refused"}.get(event.outcome, "retryable")
        if event.compensation and outcome == "refused":
            outcome = "failed"
        self._close(event.command_id, outcome, event, seq, event.error or "")

    def _timer_segment(self, seq: int, event: TimerStarted) -> None:
        if event.purpose == "retry":
            comp = event.timer_id.startswith("retry:compensate:")
            name = _retry_step(event.timer_id)
            lane = Lane.COMPENSATION if comp else Lane.STEP
            segment = Segment(name, lane, f"back-off {name}", event.at, seq, "backoff")
        elif event.purpose == "signal_timeout":
            name = _signal_of(event.timer_id) or event.timer_id
            segment = Segment(f"signal {name}", Lane.WAIT, f"wait for {name!r}", event.at, seq,
                              "waiting", detail=f"deadline {event.fire_at.isoformat()}")  # fmt: skip
        else:
            segment = Segment("sleep", Lane.WAIT, event.timer_id, event.at, seq, "waiting")
        self.segments.append(segment)
        self.open[event.timer_id] = segment

    def _close(self, key: str, outcome: str, event: Event, seq: int, why: str = "") -> None:
        segment = self.open.pop(key, None)
        if segment is not None:
            _end(segment, outcome, event.at, seq, why)

    def _stop_forward(self, seq: int, event: Event) -> None:
        """Compensation begins: the run's forward work (commands, timers) is abandoned."""
        for command_id, sent in list(self.inflight.items()):
            if not sent.compensation:
                del self.inflight[command_id]
                self.timers.pop(_timeout_id(sent), None)
                self._close(command_id, "in_doubt", event, seq)
        for timer_id in [t for t in self.timers if not t.startswith(("timeout:", "retry:comp"))]:
            del self.timers[timer_id]
            self._close(timer_id, "cancelled", event, seq)

    def _skipped(self, seq: int, event: StepSkipped) -> None:
        s = self._step(event.step)
        if event.compensation:
            s.done = True
            self._unstick(event.step)
            return
        for command_id, sent in list(self.inflight.items()):
            if sent.step == event.step and not sent.compensation:
                del self.inflight[command_id]
                self.timers.pop(_timeout_id(sent), None)
                self._close(command_id, "skipped", event, seq, event.principal)
                if sent.held is None:  # done by hand: not compensated later
                    s.forward = "skipped"
                else:  # its participant applied it: owed from now on
                    self._release(s, event.step)
                self._settle_held()
                return

    def _retry(self, seq: int, event: RetryRequested) -> None:
        held = next(
            (f for f in self.inflight.values() if f.step == event.step and f.held is not None),
            None,
        )
        if held is not None:  # the held reply is accepted now
            del self.inflight[held.command_id]
            self._release(self._step(event.step), event.step)
            self._close(held.command_id, "success", event, seq, "held reply accepted")
            self._settle_held()
        elif self.base == SagaStatus.COMPENSATION_STUCK and self.stuck_step == event.step:
            self._unstick(event.step)
        else:  # a back-off cut short
            for timer_id in [t for t in self.timers if _retry_step(t) == event.step][:1]:
                del self.timers[timer_id]
                self._close(timer_id, "backoff", event, seq, f"retried now by {event.principal}")

    def _after_timeout(self, event: Event | None) -> None:
        """A forward attempt timed out. The step's own code runs next: it starts its
        back-off, or it gives up (out of attempts, or the run is stopping) and its
        compensation is owed from that moment, its outcome unknown."""
        name, self.timed_out = self.timed_out, None
        if name is None or (
            isinstance(event, TimerStarted)
            and event.purpose == "retry"
            and _retry_step(event.timer_id) == name
        ):
            return
        s = self._step(name)
        if s.spec is not None and s.forward == "waiting":
            s.forward = "gave_up"
            self.applied.append(name)

    def _unstick(self, step: str) -> None:
        """An operator answered the stuck compensation: compensating again."""
        if self.base == SagaStatus.COMPENSATION_STUCK and self.stuck_step == step:
            self.base, self.stuck_step, self.error = SagaStatus.COMPENSATING, None, self.cause

    def _release(self, step: _Step, name: str) -> None:
        step.forward, step.held = "applied", False
        if name not in self.applied:
            self.applied.append(name)

    def _settle_held(self) -> None:
        if self.base != SagaStatus.STEP_STUCK:
            return
        held = [f.held for f in self.inflight.values() if f.held is not None]
        if held:
            self.error = held[0]
            return
        self.base = SagaStatus.RUNNING
        if self.error is not None and self.error.type == "InvalidReply":
            self.error = None

    # ------------------------------------------------------------------ the result

    def owed(self) -> list[Owed]:
        """Compensations still owed, in the order they would run (last in, first out)."""
        if self.base.is_terminal:
            return []
        if self.owed_at_start is not None:
            out = []
            for name in self.owed_at_start:
                s = self.steps.get(name, _Step())
                if s.done:
                    continue
                state = (
                    OwedState.STUCK
                    if self.stuck_step == name
                    else OwedState.COMPENSATING
                    if s.compensating
                    else OwedState.PENDING
                )
                out.append(_owed(name, s, state))
            return out
        # Steps whose outcome is unknown, and held ones (applied, not yet released),
        # join the stack only if the run stops now: they would be undone first.
        doubtful = [
            n for n, s in self.steps.items() if s.spec is not None and (s.in_doubt or s.held)
        ]
        out = [
            _owed(n, self.steps[n], OwedState.OWED if self.steps[n].held else OwedState.IN_DOUBT)
            for n in reversed(doubtful)
        ]
        out.extend(
            _owed(n, self.steps[n], OwedState.OWED)
            for n in reversed(self.applied)
            if self.steps[n].spec is not None and self.steps[n].forward in ("applied", "gave_up")
        )
        return out

    def actions(self) -> list[Action]:
        """The operator actions the runtime would accept now (see its input checks)."""
        if self.base.is_terminal:
            return []
        if self.parked:
            return [Action("resume")]
        out: list[Action] = [Action("signal")]
        forward = self.base in (SagaStatus.RUNNING, SagaStatus.STEP_STUCK) and not self.stopping
        if forward:
            out += [Action("cancel"), Action("force-compensate")]
        held = [f.step for f in self.inflight.values() if f.held is not None]
        waiting = [f.step for f in self.inflight.values() if not f.compensation and f.held is None]
        backoff = [_retry_step(t) for t, timer in self.timers.items()
                   if timer.purpose == "retry" and not t.startswith("retry:compensate:")]  # fmt: skip
        stuck = [self.stuck_step] if self.stuck_step else []
        if self.base == SagaStatus.COMPENSATION_STUCK:
            out.append(Action("resume"))
        retry = (held if forward else []) + stuck + backoff
        skip = (held + waiting if forward else []) + stuck
        if retry:
            out.append(Action("retry", tuple(dict.fromkeys(retry))))
        if skip:
            out.append(Action("skip", tuple(dict.fromkeys(skip))))
        return out

    def waits(self, awaited_signals: Iterable[str], last_at: datetime | None) -> list[Wait]:
        status = SagaStatus.NONDETERMINISTIC if self.parked else self.base
        since = last_at or datetime.min
        if status.is_terminal:
            return []
        if self.parked:
            # Nothing moves until the code is fixed and an operator resumes the saga.
            segment = self.parked_segment
            why = f": {segment.detail}" if segment is not None else ""
            return [
                Wait(
                    WaitKind.OPERATOR,
                    f"an operator: the saga is parked (deploy fixed code, then resume){why}",
                    segment.start if segment is not None else since,
                )
            ]
        out: list[Wait] = []
        if self.base == SagaStatus.COMPENSATION_STUCK and self.stuck_step is not None:
            out.append(
                Wait(
                    WaitKind.OPERATOR,
                    f"an operator: the compensation of step {self.stuck_step!r} is stuck "
                    "(retry it, skip it, or resume the saga)",
                    since, step=self.stuck_step, compensation=True,
                )
            )  # fmt: skip
        for sent in self.inflight.values():
            what = "compensation of step" if sent.compensation else "step"
            if sent.held is not None:
                out.append(
                    Wait(
                        WaitKind.OPERATOR,
                        f"an operator: the reply to step {sent.step!r} is held as invalid "
                        "(retry the step, skip it with a result, or cancel the saga)",
                        sent.since, step=sent.step, attempt=sent.attempt,
                    )
                )  # fmt: skip
                continue
            out.append(
                Wait(
                    WaitKind.REPLY,
                    f"a reply to {what} {sent.step!r} (attempt {sent.attempt}) from "
                    f"{sent.participant!r}",
                    sent.since, sent.timeout_at, sent.step, sent.command_id, sent.attempt,
                    sent.compensation,
                )
            )  # fmt: skip
        awaited = dict.fromkeys(awaited_signals)
        for timer in self.timers.values():
            if timer.purpose == "signal_timeout":
                name = _signal_of(timer.timer_id) or timer.timer_id
                awaited.pop(name, None)
                out.append(
                    Wait(WaitKind.SIGNAL, f"signal {name!r}", timer.since, timer.fire_at,
                         name=name)
                )  # fmt: skip
            elif timer.purpose == "retry":
                name = _retry_step(timer.timer_id)
                comp = timer.timer_id.startswith("retry:compensate:")
                what = "compensation of step" if comp else "step"
                out.append(
                    Wait(
                        WaitKind.BACKOFF, f"the back-off before {what} {name!r} is retried",
                        timer.since, timer.fire_at, step=name, name=timer.timer_id,
                        compensation=comp,
                    )
                )  # fmt: skip
            elif timer.purpose == "sleep":
                out.append(
                    Wait(WaitKind.TIMER, f"timer {timer.timer_id!r}", timer.since,
                         timer.fire_at, name=timer.timer_id)
                )  # fmt: skip
        for name in awaited:
            out.append(Wait(WaitKind.SIGNAL, f"signal {name!r} (no deadline)", since, name=name))
        return out


def fold(
    events: Sequence[Event], *, saga_id: str = "", awaited_signals: Iterable[str] = ()
) -> SagaView:
    """The view of a saga from its history (oldest first)."""
    state = _Fold()
    for seq, event in enumerate(events, start=1):
        state.apply(seq, event)
    state._after_timeout(None)
    started = state.started
    last_at = events[-1].at if events else None
    status = SagaStatus.NONDETERMINISTIC if state.parked else state.base
    return SagaView(
        saga_id=saga_id,
        saga_type=state.saga_type,
        status=status,
        error=state.error,
        current_step=state.current_step,
        input=dict(started.input) if started else {},
        output=state.output,
        deadline_at=started.deadline_at if started else None,
        idempotency_key=started.idempotency_key if started else None,
        in_flight=tuple(state.inflight.values()),
        timers=tuple(state.timers.values()),
        owed=tuple(state.owed()),
        stuck_step=state.stuck_step if state.base == SagaStatus.COMPENSATION_STUCK else None,
        waiting_for=tuple(state.waits(awaited_signals, last_at)),
        segments=tuple(state.segments),
        actions=tuple(state.actions()),
        events=len(events),
        started_at=events[0].at if events else None,
        last_at=last_at,
    )


# --------------------------------------------------------------------------- helpers


def _timeout_id(sent: InFlight) -> str:
    return f"timeout:{sent.command_id}:{sent.attempt}"


def _replace_held(sent: InFlight, error: ErrorInfo) -> InFlight:
    return InFlight(
        sent.step, sent.command_id, sent.attempt, sent.participant, sent.command_type,
        sent.compensation, sent.since, None, error,
    )  # fmt: skip


def _signal_of(timer_id: str) -> str | None:
    """``signal:<name>:<n>`` (a timed signal wait's timer) → the signal's name."""
    if not timer_id.startswith("signal:"):
        return None
    return timer_id[len("signal:") :].rpartition(":")[0]


def _retry_step(timer_id: str) -> str:
    """``retry:<step>:<n>`` or ``retry:compensate:<step>:<n>`` → the step."""
    body = timer_id.removeprefix("retry:").removeprefix("compensate:")
    return body.rpartition(":")[0]


def _end(segment: Segment, outcome: str, at: datetime, seq: int, why: str = "") -> None:
    segment.outcome, segment.end, segment.end_seq = outcome, at, seq
    if why:
        segment.detail = why


def _owed(name: str, step: _Step, state: OwedState) -> Owed:
    spec = step.spec
    return Owed(
        step=name,
        participant=spec.participant if spec else "",
        command_type=spec.command_type if spec else "",
        payload=dict(spec.payload) if spec else {},
        state=state,
        attempts=step.comp_attempts,
        last_error=step.last_error,
    )


__all__ = [
    "Action", "InFlight", "Lane", "Owed", "OwedState", "PendingTimer", "SagaView", "Segment", "Wait",
    "WaitKind", "fold",
]  # fmt: skip

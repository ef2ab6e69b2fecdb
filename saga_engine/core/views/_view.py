"""What an operator needs to see of a saga, from its history: a :class:`SagaView`.

Pure (no I/O, no clock): the admin API, the web page and the CLI all show a saga through
:func:`fold`. Where the saga stands (status, error, commands in flight, held replies,
timers, the stuck compensation) is the one fold of history the decision core is made of
(``_fold.Fold``); this module adds only what operators see: the compensations owed as
they stand (with the steps whose outcome is still unknown), the timeline's segments, the
actions an operator may take, and what the saga waits for.

One view rule: what is listed as awaited or owed is what can still happen
(:func:`_ahead`). Two things a history cannot say: a wait for a signal *without* a
timeout records nothing (only a timed wait records its timer), and a wait the code gave
up (the loser of an ``asyncio.wait(..., FIRST_COMPLETED)`` race, cancelled) records no
end. The caller that knows (the live or replayed runtime) passes them in ``awaited``
(``SagaRuntime.awaited()``); without it every wait its history leaves open is listed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from saga_engine.core.history._decision import CHILD_PARTICIPANT, CHILD_STEP_PREFIX, DEADLINE_TIMER
from saga_engine.core.history._events import (
    AttemptTimedOut,
    CancelRequested,
    CommandIssued,
    CompensationCompleted,
    CompensationForced,
    CompensationIssued,
    CompensationSpec,
    CompensationStarted,
    Event,
    InvalidReplyReceived,
    ReplyReceived,
    RetryRequested,
    RunContinued,
    StepAbandoned,
    StepParked,
    StepSkipped,
    TimerFired,
    TimerStarted,
    UndoRequested,
)
from saga_engine.core.history._fold import (
    SCOPE_PREFIX,
    Awaited,
    EventWait,
    Fold,
    ParkedStep,
    Sent,
    Settled,
    Timer,
    retry_timer_step,
    signal_of,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.views._segments import Lane, Segment, Timeline
from saga_engine.core.views._view_model import (
    Action,
    InFlight,
    Owed,
    OwedState,
    PendingTimer,
    SagaView,
    Wait,
    WaitKind,
)

S = SagaStatus


@dataclass(slots=True)
class _Step:
    """What the view knows of one step, for the compensations it may owe."""

    spec: CompensationSpec | None = None
    #: in_flight, waiting (to retry), held, applied, gave_up, refused, skipped, parked or
    #: abandoned (given up by the code going forward: undone at once if in doubt)
    forward: str = "in_flight"
    #: an attempt timed out since the last retryable reply: it may have been applied
    unknown: bool = False
    comp_attempts: int = 0
    last_error: str | None = None
    #: The error of its last forward attempt (what a back-off waits out).
    forward_error: str | None = None
    compensating: bool = False
    done: bool = False
    #: its success reply was held as invalid: the participant applied it
    held: bool = False

    @property
    def in_doubt(self) -> bool:
        return self.forward == "in_flight" or (
            self.forward in ("waiting", "parked") and self.unknown
        )


class _Walk:
    """The fold of a history, and what the view adds as it walks the events: the timeline,
    a ledger of the steps (for the compensations owed) and whether the run is stopping."""

    def __init__(self) -> None:
        self.fold = Fold()
        self.timeline = Timeline(self.fold)
        self.steps: dict[str, _Step] = {}
        self.applied: list[str] = []  # applied forward steps, in order
        #: compensation_started's list, once it is recorded: what is owed from then on.
        self.owed_at_start: list[str] | None = None
        #: A forward step whose attempt just timed out (see _after_timeout).
        self.timed_out: str | None = None
        #: A cancel, a forced compensation, an undo or the deadline stopped the run.
        self.stopping = False
        #: The steps the code gave up in doubt (``step_abandoned``), in that order: each
        #: compensated at once.
        self.given_up: list[str] = []

    def apply(self, seq: int, event: Event) -> None:
        if self.timed_out is not None:
            self.after_timeout(event)
        settled = self.fold.apply(event)
        self.timeline.add(seq, event, settled)
        adds = _LEDGER.get(type(event))
        if adds is not None:
            adds(self, event, settled)

    def step(self, name: str) -> _Step:
        found = self.steps.get(name)
        if found is None:
            found = self.steps[name] = _Step()
        return found

    def after_timeout(self, event: Event | None) -> None:
        """A forward attempt timed out. The step's own code runs next: it starts its
        back-off, or it gives up (out of attempts, or the run is stopping) and its
        compensation is owed from that moment, its outcome unknown."""
        name, self.timed_out = self.timed_out, None
        if name is None or (
            isinstance(event, TimerStarted)
            and event.purpose == "retry"
            and retry_timer_step(event.timer_id) == name
        ):
            return
        s = self.step(name)
        if s.spec is not None and s.forward == "waiting":
            s.forward = "gave_up"
            self.applied.append(name)

    # ------------------------------------------------------------------ per event

    def _issued(self, event: CommandIssued | CompensationIssued, _: Settled) -> None:
        s = self.step(event.step)
        if isinstance(event, CommandIssued):
            s.spec = event.compensation or s.spec
            s.forward = "in_flight"
        else:
            s.compensating = True
            s.comp_attempts += 1

    def _replied(self, event: ReplyReceived, _: Settled) -> None:
        s = self.step(event.step)
        if event.compensation:
            if event.outcome != "success":
                s.last_error = event.error or event.outcome
        elif event.outcome == "success":
            self._release(s, event.step)
        elif event.outcome == "failure":
            s.forward = "refused"
        else:  # retryable: the participant applied nothing
            s.forward, s.unknown = "waiting", False
            s.forward_error = event.error or "retryable"

    def _held(self, event: InvalidReplyReceived, _: Settled) -> None:
        # Applied by the participant, but the saga's stack takes it only once an
        # operator releases it (or the run stops while it is held).
        s = self.step(event.step)
        s.forward, s.held, s.last_error = "held", True, event.error.message

    def _timed_out(self, event: AttemptTimedOut, _: Settled) -> None:
        s = self.step(event.step)
        if event.compensation:
            s.last_error = "timed out"
        else:
            s.forward, s.unknown, s.forward_error = "waiting", True, "timed out"
            self.timed_out = event.step

    def _stop(self, event: Event, _: Settled) -> None:
        # An undo: its parent compensates. A running child stops as on a cancel; a
        # completed one compensates next (its compensation_started follows).
        undo = isinstance(event, UndoRequested)
        self.stopping = self.stopping or not undo or self.fold.status != S.COMPLETED

    def _fired(self, event: TimerFired, _: Settled) -> None:
        self.stopping = self.stopping or event.timer_id == DEADLINE_TIMER

    def _skipped(self, event: StepSkipped, settled: Settled) -> None:
        s = self.step(event.step)
        if event.compensation:
            s.done = True
        elif isinstance(settled, ParkedStep):  # done by hand; owed if it may have applied
            if s.unknown:
                self._release(s, event.step)
            else:
                s.forward = "skipped"
        elif isinstance(settled, Sent):
            if settled.held is None:  # done by hand: not compensated later
                s.forward = "skipped"
            else:  # its participant applied it: owed from now on
                self._release(s, event.step)

    def _parked(self, event: StepParked, _: Settled) -> None:
        # It waits for an operator; the run goes on (a retry, a skip) or stops (a cancel).
        self.timed_out = None
        s = self.step(event.step)
        s.forward, s.unknown = "parked", event.in_doubt

    def _retried(self, event: RetryRequested, settled: Settled) -> None:
        if isinstance(settled, Sent):  # the held reply is accepted now
            self._release(self.step(event.step), event.step)

    def _abandoned(self, event: StepAbandoned, _: Settled) -> None:
        # Off the stack: undone now (its compensation follows) if it may have applied.
        self.timed_out = None
        s = self.step(event.step)
        s.forward, s.unknown, s.held = "abandoned", event.in_doubt, False
        if event.in_doubt and s.spec is not None:
            self.given_up.append(event.step)

    def _compensating(self, event: CompensationStarted, _: Settled) -> None:
        self.owed_at_start = list(event.owed)

    def _continued(self, event: RunContinued, _: Settled) -> None:
        """A new run begins: the steps of the runs before are gone, but for the
        compensations it carries (applied, in the order they were)."""
        self.steps = {c.step: _Step(spec=c.spec, forward="applied") for c in event.carried}
        self.applied = [c.step for c in event.carried]
        self.given_up, self.owed_at_start, self.timed_out = [], None, None

    def _compensated(self, event: CompensationCompleted, _: Settled) -> None:
        self.step(event.step).done = True

    def _release(self, step: _Step, name: str) -> None:
        step.forward, step.held = "applied", False
        if name not in self.applied:
            self.applied.append(name)


_LEDGER: dict[type[Event], Callable[[_Walk, Any, Settled], None]] = {
    CommandIssued: _Walk._issued,
    CompensationIssued: _Walk._issued,
    ReplyReceived: _Walk._replied,
    InvalidReplyReceived: _Walk._held,
    AttemptTimedOut: _Walk._timed_out,
    CancelRequested: _Walk._stop,
    CompensationForced: _Walk._stop,
    UndoRequested: _Walk._stop,
    TimerFired: _Walk._fired,
    StepSkipped: _Walk._skipped,
    RetryRequested: _Walk._retried,
    StepParked: _Walk._parked,
    StepAbandoned: _Walk._abandoned,
    CompensationStarted: _Walk._compensating,
    CompensationCompleted: _Walk._compensated,
    RunContinued: _Walk._continued,
}


# --------------------------------------------------------------------------- the result


def saga_view_of(
    events: Sequence[Event], *, saga_id: str = "", awaited: Awaited | Iterable[str] = ()
) -> SagaView:
    """The view of a saga from its history (oldest first). ``awaited``: what its code
    still waits for (``SagaRuntime.awaited()``), or only the names of the signals it
    waits for without a deadline."""
    walk = _Walk()
    seq = 0
    for event in events:
        # A run that continued as new is read from its run_continued: its number says
        # where it stands in the history.
        seq = event.first_seq if isinstance(event, RunContinued) else seq + 1
        walk.apply(seq, event)
    walk.after_timeout(None)
    f = walk.fold
    ahead = _ahead(walk, awaited if isinstance(awaited, Awaited) else Awaited(tuple(awaited)))
    started = f.started
    last_at = events[-1].at if events else None
    return SagaView(
        saga_id=saga_id,
        saga_type=started.saga_type if started else "",
        status=f.shown_status,
        error=f.error,
        current_step=f.current_step,
        input=dict(started.input) if started else {},
        output=f.output,
        deadline_at=started.deadline_at if started else None,
        idempotency_key=started.idempotency_key if started else None,
        in_flight=tuple(_in_flight(sent) for sent in ahead.inflight),
        timers=tuple(PendingTimer(t.timer_id, t.purpose, t.fire_at, t.since) for t in ahead.timers),
        owed=tuple(ahead.owed),
        stuck_step=f.stuck_step,
        waiting_for=tuple(_waits(walk, ahead, last_at)),
        segments=tuple(walk.timeline.segments),
        actions=tuple(_actions(walk, ahead)),
        events=len(events),
        started_at=events[0].at if events else None,
        last_at=last_at,
        pivot_step=f.pivot_step,
        past_pivot=f.past_pivot,
        parked_steps=tuple(f.parked_steps),
        stuck_steps=f.stuck_steps,
        run=f.run,
    )


@dataclass(frozen=True, slots=True)
class _Ahead:
    """What can still happen to a saga: all the view lists as awaited or owed."""

    inflight: tuple[Sent, ...] = ()
    timers: tuple[Timer, ...] = ()
    event_waits: tuple[EventWait, ...] = ()
    #: The signals waited for without a deadline (a timed wait is one of ``timers``).
    signals: tuple[str, ...] = ()
    owed: tuple[Owed, ...] = ()
    #: Its run has ended (``Awaited.run_ended``): no cancel, no forced compensation.
    run_ended: bool = False


def _ahead(walk: _Walk, awaited: Awaited) -> _Ahead:
    """The one view rule: what is listed as awaited or owed is what can still happen.

    - An ended saga awaits and owes nothing.
    - A command, a timer or a domain-event wait its history leaves open is awaited only
      while the code still holds it: a wait the code gave up (the loser of a race) can
      never end, so it is not listed, past its deadline or not.
    - A saga past its pivot only goes forward (a cancel is refused, its deadline lifted,
      a step that cannot succeed parks, an undo from its parent is refused): its stack
      owes no compensation, since none of them can run. A step its code gave up is
      undone all the same (a path not taken), and listed while it is.
    """
    f = walk.fold
    if f.status.is_terminal:
        return _Ahead()
    timers = tuple(t for t in f.timers.values() if awaited.holds(t.timer_id))
    timed = {signal_of(t.timer_id) or t.timer_id for t in timers if t.purpose == "signal_timeout"}
    return _Ahead(
        inflight=tuple(s for cid, s in f.inflight.items() if awaited.holds(cid)),
        timers=timers,
        event_waits=tuple(w for wid, w in f.event_waits.items() if awaited.holds(wid)),
        signals=tuple(n for n in dict.fromkeys(awaited.signals) if n not in timed),
        owed=tuple(_owed_now(walk, stack=f.may_compensate)),
        run_ended=awaited.run_ended,
    )


def _in_flight(sent: Sent) -> InFlight:
    e = sent.event
    if sent.held is not None:  # answered: it no longer times out
        timeout_at, held = None, sent.held.error
    else:
        timeout_at, held = e.timeout_at, None
    return InFlight(
        e.step,
        e.command_id,
        e.attempt,
        e.participant,
        e.command_type,
        sent.compensation,
        e.at,
        timeout_at,
        held,
    )


def _owed_now(walk: _Walk, *, stack: bool) -> list[Owed]:
    """Compensations owed by a saga still open, in the order they would run (last in,
    first out): first those of the steps its code gave up, under way already (past the
    pivot too: a path not taken is undone), then its stack's if it may still compensate
    (``stack``: see ``_ahead``)."""
    steps = walk.steps
    out = [
        _owed(name, steps[name], _undo_state(walk, name, steps[name]))
        for name in walk.given_up
        if not steps[name].done
    ]
    if not stack:
        return out
    if walk.owed_at_start is not None:
        for name in walk.owed_at_start:
            s = steps.get(name, _Step())
            if not s.done:
                out.append(_owed(name, s, _undo_state(walk, name, s)))
        return out
    # Steps whose outcome is unknown, and held ones (applied, not yet released),
    # join the stack only if the run stops now: they would be undone first.
    doubtful = [n for n, s in steps.items() if s.spec is not None and (s.in_doubt or s.held)]
    out += [
        _owed(n, steps[n], OwedState.OWED if steps[n].held else OwedState.IN_DOUBT)
        for n in reversed(doubtful)
    ]
    out.extend(
        _owed(n, steps[n], OwedState.OWED)
        for n in reversed(walk.applied)
        if steps[n].spec is not None and steps[n].forward in ("applied", "gave_up")
    )
    return out


def _undo_state(walk: _Walk, name: str, step: _Step) -> OwedState:
    if name in walk.fold.stuck_steps:
        return OwedState.STUCK
    return OwedState.COMPENSATING if step.compensating else OwedState.PENDING


def _actions(walk: _Walk, ahead: _Ahead) -> list[Action]:
    """The operator actions the runtime would accept now (see its input checks in
    ``_inputs``; ``tests/internal/unit/test_view_actions.py`` holds them to agree)."""
    f = walk.fold
    if f.status.is_terminal:
        return []
    if f.parked:
        return [Action("resume")]
    forward = f.going_forward and not walk.stopping
    # A run that is undoing its steps waits for no signal any more (``_signal`` refuses).
    out: list[Action] = [Action("signal")] if forward else []
    if forward and not f.past_pivot and not ahead.run_ended:
        out += [Action("cancel"), Action("force-compensate")]
    held = [s.event.step for s in ahead.inflight if s.held is not None]
    waiting = [s.event.step for s in ahead.inflight if not s.compensation and s.held is None]
    # Any command awaiting its reply (a compensation's too) may be re-sent, same id.
    resend = [s.event.step for s in ahead.inflight if s.held is None]
    backoff = [retry_timer_step(t.timer_id) for t in ahead.timers if t.purpose == "retry"]
    stuck = list(f.stuck_steps)
    if f.status == S.COMPENSATION_STUCK:
        out.append(Action("resume"))
    parked = list(f.parked_steps) if forward else []
    retry = (held if forward else []) + parked + stuck + backoff + resend
    skip = (held + waiting if forward else []) + parked + stuck
    if retry:
        out.append(Action("retry", tuple(dict.fromkeys(retry))))
    if skip:
        out.append(Action("skip", tuple(dict.fromkeys(skip))))
    return out


def _waits(walk: _Walk, ahead: _Ahead, last_at: datetime | None) -> list[Wait]:
    f = walk.fold
    since = last_at or datetime.min
    if f.shown_status.is_terminal:
        return []
    if f.parked:
        # Nothing moves until the code is fixed and an operator resumes the saga.
        segment = walk.timeline.parked
        why = f": {segment.detail}" if segment is not None else ""
        return [
            Wait(
                WaitKind.OPERATOR,
                f"an operator: the saga is parked (deploy fixed code, then resume){why}",
                segment.start if segment is not None else since,
            )
        ]
    out: list[Wait] = []
    if f.stuck_steps:
        how = "retry it, skip it, or resume the saga"
        if f.status != S.COMPENSATION_STUCK:  # a step the code gave up, going forward
            how = "its code gave the step up; retry it, or skip it once undone by hand"
        out += [
            Wait(
                WaitKind.OPERATOR,
                f"an operator: the compensation of step {stuck!r} is stuck ({how})",
                since,
                step=stuck,
                compensation=True,
            )
            for stuck in f.stuck_steps
        ]
    out += [_parked_wait(parked) for parked in f.parked_steps.values()]
    out += [_command_wait(sent) for sent in ahead.inflight]
    key = f.key
    if key is not None and not key.held and f.going_forward and not walk.stopping:
        segment = walk.timeline.timers.get(f"key:{key.key}")
        behind = ", ".join(key.behind) or "none"
        out.append(
            Wait(
                WaitKind.KEY,
                f"concurrency key {key.key!r}: queued behind saga {behind} "
                f"(position {key.position})",
                segment.start if segment is not None else since,
                name=key.key,
            )
        )
    for timer in ahead.timers:
        wait = _timer_wait(timer, walk.steps)
        if wait is not None:
            out.append(wait)
    out += [
        Wait(WaitKind.SIGNAL, f"signal {n!r} (no deadline)", since, name=n) for n in ahead.signals
    ]
    for w in ahead.event_waits:
        e = w.event
        what = f"event {e.source} key={e.key}"
        out.append(Wait(WaitKind.EVENT, what, e.at, e.timeout_at, name=e.source))
    return out


def _parked_wait(parked: ParkedStep) -> Wait:
    e = parked.event
    pivot = " (the saga is past its pivot)" if e.past_pivot else ""
    return Wait(
        WaitKind.OPERATOR,
        f"an operator: step {e.step!r} is parked{pivot}: {e.error.message}",
        e.at,
        step=e.step,
    )


def _command_wait(sent: Sent) -> Wait:
    e = sent.event
    if sent.held is not None:
        return Wait(
            WaitKind.OPERATOR,
            f"an operator: the reply to step {e.step!r} is held as invalid "
            "(retry the step, skip it with a result, or cancel the saga)",
            e.at,
            step=e.step,
            attempt=e.attempt,
        )
    if e.participant == CHILD_PARTICIPANT:  # name: the child's id
        child = e.payload.get("saga_id") if isinstance(e.payload, dict) else None
        which = f"child saga {e.step.removeprefix(CHILD_STEP_PREFIX)!r} ({child})"
        what = f"{which} to answer its undo" if sent.compensation else f"{which} to end"
        return Wait(
            WaitKind.CHILD,
            what,
            e.at,
            e.timeout_at,
            e.step,
            str(child),
            e.attempt,
            sent.compensation,
        )
    what = "compensation of step" if sent.compensation else "step"
    return Wait(
        WaitKind.REPLY,
        f"a reply to {what} {e.step!r} (attempt {e.attempt}) from {e.participant!r}",
        e.at,
        e.timeout_at,
        e.step,
        e.command_id,
        e.attempt,
        sent.compensation,
    )


def _timer_wait(timer: Timer, steps: dict[str, _Step]) -> Wait | None:
    """What waiting on ``timer`` is, to an operator (None: an attempt's timeout or the
    deadline, which its command or the saga as a whole stand for)."""
    if timer.purpose == "signal_timeout":
        name = signal_of(timer.timer_id) or timer.timer_id
        return Wait(WaitKind.SIGNAL, f"signal {name!r}", timer.since, timer.fire_at, name=name)
    if timer.purpose == "retry":
        name = retry_timer_step(timer.timer_id)
        comp = timer.timer_id.startswith("retry:compensate:")
        what = "compensation of step" if comp else "step"
        ledger = steps.get(name, _Step())
        # retry:[compensate:]<step>:<n>: the wait follows the step's attempt n.
        attempt = timer.timer_id.rpartition(":")[2]
        return Wait(
            WaitKind.BACKOFF,
            f"the back-off before {what} {name!r} is retried",
            timer.since,
            timer.fire_at,
            step=name,
            name=timer.timer_id,
            compensation=comp,
            attempt=int(attempt) if attempt.isdigit() else None,
            last_error=ledger.last_error if comp else ledger.forward_error,
        )
    if timer.purpose == "callback_timeout":
        # callback:<name>:<n>, its wait's id
        name = timer.timer_id.removeprefix("callback:").rpartition(":")[0]
        return Wait(
            WaitKind.CALLBACK,
            f"callback {name!r}: a call of its URL",
            timer.since,
            timer.fire_at,
            name=timer.timer_id,
        )
    if timer.purpose == "sleep":
        scope = timer.timer_id.startswith(SCOPE_PREFIX)
        return Wait(
            WaitKind.TIMER,
            f"the deadline of a ctx.timeout block ({timer.timer_id})"
            if scope
            else f"timer {timer.timer_id!r}",
            timer.since,
            timer.fire_at,
            name=timer.timer_id,
        )
    return None


# --------------------------------------------------------------------------- helpers


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
    "Action",
    "InFlight",
    "Lane",
    "Owed",
    "OwedState",
    "PendingTimer",
    "SagaView",
    "Segment",
    "Wait",
    "WaitKind",
    "saga_view_of",
]

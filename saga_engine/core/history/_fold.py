"""The one fold of a saga's history: where the saga stands after each event.

Pure: no I/O, no clock, no saga code. :meth:`Fold.apply` takes the events one at a time,
recorded or new, and keeps what they say: the status and its error, the step the saga is
at, its output, the commands sent and not answered yet (and the replies held as invalid),
the timers armed, the compensation stuck for an operator, and the ids it has seen. Every
rule about what an event does to where a saga stands is written here, once: which
command a reply or a skip answers, which timer a retry cuts short, when a held reply
stops holding the saga, what a compensation's start abandons.

Two readers build on it and add only their own part:

- the decision core: ``_state.SagaState`` *is* a fold. The saga's code hangs the futures
  it awaits on the commands and timers the fold holds, and drops a wait its code gave up
  (a cancelled task), which no event records;
- the operator's view (``_view.saga_view_of``): adds what operators see, the compensations owed as
  they stand, the timeline, the actions an operator may take, and what the saga waits for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from typing import Any, ClassVar, NoReturn, TypeVar

import msgspec
from pydantic import BaseModel

from saga_engine.core.history._concurrency_keys import KeyHold
from saga_engine.core.history._decision import DEADLINE_TIMER
from saga_engine.core.history._events import (
    AttemptTimedOut,
    CallbackAwaited,
    CallbackReceived,
    CommandIssued,
    CompensationIssued,
    CompensationStarted,
    CompensationStuck,
    DomainEventReceived,
    ErrorInfo,
    Event,
    EventAwaited,
    InvalidReplyReceived,
    KeyAcquired,
    KeyQueued,
    PivotPassed,
    ReplyReceived,
    RetryRequested,
    RunContinued,
    SagaCancelled,
    SagaCompensated,
    SagaCompleted,
    SagaFailed,
    SagaParked,
    SagaResumed,
    SagaStarted,
    SignalReceived,
    StepAbandoned,
    StepParked,
    StepSkipped,
    TimerFired,
    TimerStarted,
    UndoRequested,
)
from saga_engine.core.history._status import SagaStatus, check_transition
from saga_engine.kernel._serde import JsonDict

S = SagaStatus


# What the fold keeps per command, timer and wait: msgspec structs, as the decision
# core's plain data (``_decision``), built per command for less than a dataclass.
class Sent(msgspec.Struct):
    """A command sent and not answered yet (or answered with a reply held as invalid)."""

    event: CommandIssued | CompensationIssued
    #: Its success reply did not match its step's model (or could not be stored): the
    #: step waits for an operator's retry or skip, and the saga is step_stuck meanwhile.
    held: InvalidReplyReceived | None = None
    #: What the saga's code awaits; None in a fold without code (a view).
    future: asyncio.Future[ReplyReceived | None] | None = None
    #: The step's reply model (``returns=``), known to the code: a success reply must match.
    returns: type[BaseModel] | None = None

    @property
    def compensation(self) -> bool:
        return isinstance(self.event, CompensationIssued)


class ParkedStep(msgspec.Struct):
    """A forward step parked for an operator (``step_parked``): no command in flight, the
    saga step_stuck until a retry (maybe with an edited command) or a skip answers it."""

    event: StepParked
    #: What the saga's code awaits: the operator's retry_requested or step_skipped.
    future: asyncio.Future[RetryRequested | StepSkipped] | None = None
    #: Known to the code: the step's command model (an edited command must match it)...
    command_model: type[BaseModel] | None = None
    #: ...and its reply model (a skip's result must match it).
    returns: type[BaseModel] | None = None


class Timer(msgspec.Struct):
    """A timer armed and not fired yet."""

    timer_id: str
    #: sleep, retry, signal_timeout, timeout (an attempt's) or deadline
    purpose: str
    fire_at: datetime
    since: datetime
    #: An attempt's timeout: the command it times out.
    command_id: str | None = None
    #: What the saga's code awaits; None in a fold without code, and for the deadline.
    future: asyncio.Future[None] | None = None


class EventWait(msgspec.Struct):
    """A wait for a domain event (``ctx.wait_event``), not answered yet."""

    event: EventAwaited
    #: What the saga's code awaits; None in a fold without code (a view).
    future: asyncio.Future[Any] | None = None


class CallbackWait(msgspec.Struct):
    """A callback URL's wait (``ctx.callback``), not answered yet."""

    event: CallbackAwaited
    #: What the saga's code awaits (the answer, or None when the wait's timer fired);
    #: None in a fold without code (a view).
    future: asyncio.Future[CallbackReceived | None] | None = None
    #: The model the code reads the body with (a body it refuses is a 422, recorded
    #: nowhere); None for a plain JSON object, or in a fold without code.
    model: type[BaseModel] | None = None


class Awaited(msgspec.Struct, frozen=True):
    """What a saga's code still waits for, as its runtime (live, or replayed from the
    history) holds it. A history records when a wait begins but not when the code gives
    it up (the loser of an ``asyncio.wait(..., FIRST_COMPLETED)`` race, cancelled), nor a
    wait for a signal without a deadline: only the code knows those."""

    #: The signals it waits for (with or without a deadline), by name.
    signals: tuple[str, ...] = ()
    #: The ids of the commands, timers and domain-event waits it still holds; None when
    #: not known (no runtime at hand): then every one its history leaves open counts.
    held: frozenset[str] | None = None
    #: Its ``run`` has ended (returned, or failed with nothing on its stack), and the
    #: saga ends once the steps its code gave up are undone: nothing is left to cancel
    #: (nor to compensate by force).
    run_ended: bool = False

    def holds(self, wait_id: str) -> bool:
        return self.held is None or wait_id in self.held


K = TypeVar("K")
V = TypeVar("V")


class _SharedEmpty(dict[Any, Any]):
    """An empty dict every saga shares until it has an entry of its own (``owned``),
    which refuses to be written: a write to it would be every saga's. An engine holds a
    saga's state for each saga in memory, and a dozen empty dicts are 64 bytes each."""

    __slots__ = ()

    def _refuse(self) -> NoReturn:
        raise TypeError("the shared empty dict is read-only: write to owned(d)")

    def __setitem__(self, key: Any, value: Any) -> None:
        self._refuse()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        self._refuse()

    def update(self, *args: Any, **kwargs: Any) -> None:
        self._refuse()

    def __ior__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        self._refuse()


#: See ``_SharedEmpty``: the value of a saga's dicts until their first entry.
NO_ENTRIES: dict[Any, Any] = _SharedEmpty()


def owned(entries: dict[K, V]) -> dict[K, V]:
    """``entries``, or a dict of the saga's own in place of the shared ``NO_ENTRIES``:
    what is written to first."""
    return {} if entries is NO_ENTRIES else entries


#: The open event waits of a saga that has none: shared, never written to (most sagas
#: never wait for a domain event, and an empty dict each is memory for nothing).
NO_WAITS: dict[str, EventWait] = {}
#: The same for callback waits, and for the callbacks received (wait id -> digest).
NO_CALLBACK_WAITS: dict[str, CallbackWait] = {}
NO_CALLBACKS: dict[str, str] = {}


class Unstuck(Enum):
    """What :meth:`Fold.apply` returns for an operator's answer to a stuck compensation."""

    COMPENSATION = "compensation"


#: What an event settled, as :meth:`Fold.apply` returns it: the command it answered, the
#: timer it fired or cut short, the stuck compensation or parked step it released,
#: the event wait it answered, or nothing.
Settled = Sent | Timer | Unstuck | ParkedStep | EventWait | CallbackWait | None


def timeout_timer_id(command_id: str, attempt: int) -> str:
    return f"timeout:{command_id}:{attempt}"


def retry_timer_step(timer_id: str) -> str:
    """``retry:<step>:<n>`` or ``retry:compensate:<step>:<n>`` → the step."""
    body = timer_id.removeprefix("retry:").removeprefix("compensate:")
    return body.rpartition(":")[0]


#: A ``ctx.timeout`` block's timer id: ``scope:<n>`` (a ``sleep`` timer in history).
SCOPE_PREFIX = "scope:"


def forward_backoff_of(timer_id: str, step: str) -> bool:
    """Whether ``timer_id`` is the back-off of forward step ``step`` (``retry:<step>:<n>``)."""
    return (
        timer_id.startswith("retry:")
        and not timer_id.startswith("retry:compensate:")
        and retry_timer_step(timer_id) == step
    )


def signal_of(timer_id: str) -> str | None:
    """``signal:<name>:<n>`` (a timed signal wait's timer) → the signal's name."""
    if not timer_id.startswith("signal:"):
        return None
    return timer_id[len("signal:") :].rpartition(":")[0]


#: A saga's ids of one kind (commands issued, signals and domain events seen, ...): a
#: tuple while they are few, a set past ``_FEW_IDS``. A set of one id is 216 bytes, of
#: five 728, and an engine holds a few per saga in memory; a tuple of sixteen is 168,
#: and looking an id up in it costs no more than hashing it.
Ids = tuple[str, ...] | set[str]
#: The ids of a kind until the first (shared: a tuple is never written to).
NO_IDS: Ids = ()
_FEW_IDS = 16


#: No step parked: shared by every fold until its first ``step_parked`` (an empty dict
#: per saga would cost most sagas, which never park one, 64 bytes each). Never written:
#: a fold that parks a step gets a dict of its own first.
NO_PARKED: dict[str, ParkedStep] = {}


def with_id(ids: Ids, value: str) -> Ids:
    """``ids`` with ``value`` added: the set itself, or a new tuple (a set once they are
    more than ``_FEW_IDS``)."""
    if type(ids) is set:
        ids.add(value)
        return ids
    if value in ids:
        return ids
    if len(ids) < _FEW_IDS:
        return (*ids, value)
    return {*ids, value}


#: The status each of the saga's ends leaves it in.
END_STATUS: dict[type[Event], SagaStatus] = {
    SagaCompleted: S.COMPLETED,
    SagaFailed: S.FAILED,
    SagaCompensated: S.COMPENSATED,
    SagaCancelled: S.CANCELLED,
}


class Fold:
    """Where a saga stands, from its history."""

    # Slots: the decision core keeps one per live saga (up to engine.cache_size).
    __slots__ = (
        "callback_waits",
        "callbacks_received",
        "cause",
        "current_step",
        "error",
        "event_waits",
        "inflight",
        "issued_ids",
        "key",
        "last_attempt",
        "output",
        "parked",
        "parked_steps",
        "past_pivot",
        "pivot_step",
        "run",
        "seen_events",
        "seen_signals",
        "started",
        "status",
        "stuck_steps",
        "timers",
        "undo_ids",
    )

    #: Whether a move of status is checked against TRANSITIONS. The decision core checks
    #: every move it makes (a wrong one is a bug); a view shows a stored history as it is.
    checked: ClassVar[bool] = False

    def __init__(self) -> None:
        #: The status the saga's own events reached; ``parked`` overlays it (a park for
        #: nondeterminism stops the code without changing where the saga stands).
        self.status = S.RUNNING
        self.parked = False
        self.error: ErrorInfo | None = None
        #: Why it compensates: its compensation_started's error (a saga starts once).
        self.cause: ErrorInfo | None = None
        self.current_step: str | None = None
        self.output: JsonDict | None = None
        #: The compensations that exhausted their retries, while compensation_stuck, in
        #: the order they got stuck (several when independent steps are undone in
        #: parallel: each waits for its own operator's answer).
        self.stuck_steps: tuple[str, ...] = ()
        self.started: SagaStarted | None = None
        self.inflight: dict[str, Sent] = {}
        self.timers: dict[str, Timer] = NO_ENTRIES
        self.issued_ids: Ids = NO_IDS
        #: The parent's compensation commands this child was asked to undo by.
        self.undo_ids: Ids = NO_IDS
        self.seen_signals: Ids = NO_IDS
        #: The last attempt sent per forward command id (for a compensation's span link).
        self.last_attempt: dict[str, int] = NO_ENTRIES
        #: Forward steps parked for an operator (``step_parked``), by step.
        self.parked_steps: dict[str, ParkedStep] = NO_PARKED
        #: The pivot step, once its command is issued, and whether it has succeeded.
        self.pivot_step: str | None = None
        self.past_pivot = False
        #: The domain events waited for and not answered yet, by wait id; the ids of the
        #: domain events received (a fact answers a saga once).
        self.event_waits: dict[str, EventWait] = NO_WAITS
        self.seen_events: Ids = NO_IDS
        #: The callback waits not answered yet, by wait id; the digest of each callback
        #: received, by wait id (a repeat gets the same answer, another body a conflict).
        self.callback_waits: dict[str, CallbackWait] = NO_CALLBACK_WAITS
        self.callbacks_received: dict[str, str] = NO_CALLBACKS
        #: Its concurrency key, once the history says it queued for it or holds it.
        self.key: KeyHold | None = None
        #: The run it is in (``run_continued`` begins the next; the first is 1).
        self.run = 1

    def apply(self, event: Event) -> Settled:
        """Folds one event in; returns what it settled (see :data:`Settled`)."""
        handler = FOLD_HANDLERS.get(type(event))
        return handler(self, event) if handler is not None else None

    # ------------------------------------------------------------------ queries

    @property
    def shown_status(self) -> SagaStatus:
        """The status as reported: nondeterministic while parked, else where it stands."""
        return S.NONDETERMINISTIC if self.parked else self.status

    @property
    def may_compensate(self) -> bool:
        """Whether its compensations can still run: not once it ended, nor past its
        pivot (from there it only goes forward: a cancel is refused, its deadline lifted,
        a step that cannot succeed parks, its parent's undo is refused)."""
        return not self.status.is_terminal and not self.past_pivot

    @property
    def going_forward(self) -> bool:
        """Still going forward: running, or running with a step held for an operator."""
        return self.status in (S.RUNNING, S.STEP_STUCK)

    def waiting_forward(self, step: str) -> Sent | None:
        """The forward command of ``step`` waiting for its reply, if any."""
        return next(
            (f for f in self.inflight.values() if f.event.step == step and not f.compensation),
            None,
        )

    def awaiting_reply(self, step: str) -> list[Sent]:
        """The commands of ``step`` waiting for their reply: an operator's retry re-sends
        them under the same ids. (A held reply is an answer: nothing to re-send.)"""
        return [f for f in self.inflight.values() if f.event.step == step and f.held is None]

    def retry_timer(self, step: str) -> str | None:
        """The timer of ``step`` (or of its compensation) waiting out a back-off, if any."""
        prefixes = (f"retry:{step}:", f"retry:compensate:{step}:")
        return next((t for t in self.timers if t.startswith(prefixes)), None)

    def steps_in_flight(self) -> list[str]:
        return sorted({f.event.step for f in self.inflight.values()})

    def held_steps(self) -> list[str]:
        """Steps whose success reply was held as invalid, waiting for an operator."""
        return sorted({f.event.step for f in self.inflight.values() if f.held is not None})

    def operator_steps(self) -> list[str]:
        """Forward steps waiting for an operator: a held reply's, or parked ones."""
        return sorted({*self.held_steps(), *self.parked_steps})

    # ------------------------------------------------------------------ shared moves

    def settle_held(self) -> None:
        """step_stuck lasts while a reply is held or a step is parked: when none is
        (released by an operator, or its step ended another way), the saga is running
        again. The one rule for "a step waits for an operator"."""
        if self.status != S.STEP_STUCK or self.stuck_steps:
            return  # (a compensation stuck while going forward: see _on_stuck)
        for sent in self.inflight.values():
            if sent.held is not None:
                self.error = sent.held.error  # with several held, the first one's
                return
        for parked in self.parked_steps.values():
            self.error = parked.event.error
            return
        self._move(S.RUNNING)
        if self.error is not None and self.error.type in (
            "InvalidReply",
            "StepParked",
            "CompensationStuck",
        ):
            self.error = None

    def _move(self, new: SagaStatus) -> None:
        if self.checked:
            check_transition(self.status, new)
        self.status = new

    @property
    def stuck_step(self) -> str | None:
        """The first stuck compensation (the one an operator is asked about first)."""
        return self.stuck_steps[0] if self.stuck_steps else None

    def _unstick(self, step: str) -> Unstuck | None:
        """An operator answered the stuck compensation of ``step``: compensating again
        once no other compensation is stuck (or, stuck while the run went forward, the
        compensation of a step its code gave up: running again once nothing waits for
        an operator)."""
        if step not in self.stuck_steps or self.status not in (
            S.COMPENSATION_STUCK,
            S.STEP_STUCK,
        ):
            return None
        self.stuck_steps = tuple(s for s in self.stuck_steps if s != step)
        if self.status == S.STEP_STUCK:
            self.settle_held()
        elif not self.stuck_steps:
            self._move(S.COMPENSATING)
            self.error = self.cause
        return Unstuck.COMPENSATION

    def _answered(self, command_id: str) -> Sent | None:
        """The command ``command_id`` is answered: no longer in flight, nor timed."""
        sent = self.inflight.pop(command_id, None)
        if sent is not None and sent.event.timeout_at is not None:
            self.timers.pop(timeout_timer_id(command_id, sent.event.attempt), None)
        return sent

    # ------------------------------------------------------------------ per event

    def _on_started(self, event: SagaStarted) -> None:
        self.started = event
        if event.deadline_at is not None:
            self.timers = owned(self.timers)
            self.timers[DEADLINE_TIMER] = Timer(
                DEADLINE_TIMER, "deadline", event.deadline_at, event.at
            )

    def _on_issued(self, event: CommandIssued | CompensationIssued) -> None:
        command_id = event.command_id
        self.current_step = event.step
        self.issued_ids = with_id(self.issued_ids, command_id)
        if type(event) is CommandIssued:
            if event.attempt != 1:  # (a first attempt's is read as 1 without an entry)
                self.last_attempt = owned(self.last_attempt)
                self.last_attempt[command_id] = event.attempt
            if event.pivot:
                self.pivot_step = event.step
        self.inflight[command_id] = Sent(event)
        if event.timeout_at is not None:
            timer_id = timeout_timer_id(command_id, event.attempt)
            self.timers = owned(self.timers)
            self.timers[timer_id] = Timer(
                timer_id, "timeout", event.timeout_at, event.at, command_id
            )

    def _on_reply(self, event: ReplyReceived | AttemptTimedOut) -> Sent | None:
        return self._answered(event.command_id)

    def _on_held(self, event: InvalidReplyReceived) -> Sent | None:
        # The step keeps waiting, for an operator now: its attempt no longer times out
        # (the participant did answer), and nothing re-sends it.
        sent = self.inflight.get(event.command_id)
        if sent is not None:
            sent.held = event
            if sent.event.timeout_at is not None:
                self.timers.pop(timeout_timer_id(event.command_id, sent.event.attempt), None)
        self._move(S.STEP_STUCK)
        self.error = event.error
        self.settle_held()
        return sent

    def _on_timer_started(self, event: TimerStarted) -> None:
        self.timers = owned(self.timers)
        self.timers[event.timer_id] = Timer(event.timer_id, event.purpose, event.fire_at, event.at)

    def _on_timer_fired(self, event: TimerFired) -> Timer | None:
        timer = self.timers.pop(event.timer_id, None)
        if timer is not None and timer.purpose == "event_timeout":
            self.event_waits.pop(event.timer_id, None)  # the wait is over, unanswered
        elif timer is not None and timer.purpose == "callback_timeout":
            self.callback_waits.pop(event.timer_id, None)
        return timer

    def _on_callback_awaited(self, event: CallbackAwaited) -> None:
        if self.callback_waits is NO_CALLBACK_WAITS:
            self.callback_waits = {}
        self.callback_waits[event.wait_id] = CallbackWait(event)
        self.timers = owned(self.timers)
        self.timers[event.wait_id] = Timer(
            event.wait_id, "callback_timeout", event.expires_at, event.at
        )

    def _on_callback(self, event: CallbackReceived) -> CallbackWait | None:
        if self.callbacks_received is NO_CALLBACKS:
            self.callbacks_received = {}
        self.callbacks_received[event.wait_id] = event.digest
        self.timers.pop(event.wait_id, None)
        return self.callback_waits.pop(event.wait_id, None)

    def _on_event_awaited(self, event: EventAwaited) -> None:
        if self.event_waits is NO_WAITS:
            self.event_waits = {}
        self.event_waits[event.wait_id] = EventWait(event)
        if event.timeout_at is not None:
            self.timers = owned(self.timers)
            self.timers[event.wait_id] = Timer(
                event.wait_id, "event_timeout", event.timeout_at, event.at
            )

    def _on_domain_event(self, event: DomainEventReceived) -> EventWait | None:
        self.seen_events = with_id(self.seen_events, event.event_id)
        self.timers.pop(event.wait_id, None)
        return self.event_waits.pop(event.wait_id, None)

    def _on_signal(self, event: SignalReceived) -> Timer | None:
        self.seen_signals = with_id(self.seen_signals, event.signal_id)
        # A timed wait for it is over (one wait per name at a time).
        timer_id = next((t for t in self.timers if signal_of(t) == event.name), None)
        return self.timers.pop(timer_id) if timer_id is not None else None

    def _on_undo(self, event: UndoRequested) -> None:
        self.undo_ids = with_id(self.undo_ids, event.command_id)

    def _on_step_parked(self, event: StepParked) -> None:
        if self.parked_steps is NO_PARKED:
            self.parked_steps = {}
        self.parked_steps[event.step] = ParkedStep(event)
        self._move(S.STEP_STUCK)
        self.error = event.error

    def _on_pivot(self, event: PivotPassed) -> None:
        # Past the pivot the saga only goes forward: its deadline no longer applies.
        self.pivot_step, self.past_pivot = event.step, True
        self.timers.pop(DEADLINE_TIMER, None)

    def _unpark(self, step: str) -> ParkedStep | None:
        """An operator answered the parked step ``step`` (a retry or a skip)."""
        parked = self.parked_steps.pop(step, None)
        if parked is not None:
            self.settle_held()
        return parked

    def _on_skipped(self, event: StepSkipped) -> Settled:
        if event.compensation:  # the stuck compensation, done by hand
            return self._unstick(event.step)
        if event.step in self.parked_steps:
            return self._unpark(event.step)
        sent = self.waiting_forward(event.step)
        if sent is not None:  # the result stands in for its reply
            self._answered(sent.event.command_id)
            self.settle_held()
        return sent

    def _on_retry(self, event: RetryRequested) -> Settled:
        if event.step in self.parked_steps:
            return self._unpark(event.step)
        sent = self.waiting_forward(event.step)
        if sent is not None and sent.held is not None:  # its held reply is accepted now
            del self.inflight[sent.event.command_id]
            self.settle_held()
            return sent
        unstuck = self._unstick(event.step)
        if unstuck is not None:
            return unstuck
        timer_id = self.retry_timer(event.step)  # a back-off cut short
        return self.timers.pop(timer_id) if timer_id is not None else None

    def _on_abandoned(self, event: StepAbandoned) -> None:
        """The code gave the step up: none of its commands is waited for any more (a late
        reply is a duplicate), nor its back-off, nor an operator for it if it was parked.
        Its compensation, if owed, follows as its own commands."""
        for command_id in event.command_ids:
            sent = self.inflight.get(command_id)
            if sent is not None and not sent.compensation:
                self._answered(command_id)
        for timer_id in [t for t in self.timers if forward_backoff_of(t, event.step)]:
            del self.timers[timer_id]
        if event.step in self.parked_steps:
            del self.parked_steps[event.step]
        self.settle_held()

    def _on_compensation_started(self, event: CompensationStarted) -> None:
        self._move(S.COMPENSATING)
        self.error = self.cause = event.error
        # The run's forward work is abandoned: its commands (in doubt now) and its timers.
        for command_id in [c for c, sent in self.inflight.items() if not sent.compensation]:
            self._answered(command_id)
        self.parked_steps = NO_PARKED
        for timer_id in [
            t for t in self.timers if not t.startswith(("timeout:", "retry:compensate:"))
        ]:
            del self.timers[timer_id]
        self.event_waits = NO_WAITS
        if self.stuck_steps:  # a given-up step's compensation is stuck: still waits
            self._move(S.COMPENSATION_STUCK)

    def _on_stuck(self, event: CompensationStuck) -> None:
        if self.going_forward:
            # The compensation of a step the code gave up (step_abandoned), stuck while
            # the run goes forward: the saga waits for an operator's retry or skip of it.
            self._move(S.STEP_STUCK)
        elif self.status != S.COMPENSATION_STUCK:
            self._move(S.COMPENSATION_STUCK)
        self.error = event.error
        if event.step not in self.stuck_steps:
            self.stuck_steps = (*self.stuck_steps, event.step)

    def _on_parked(self, event: SagaParked) -> None:
        self.parked, self.error = True, event.error

    def _on_resumed(self, event: SagaResumed) -> None:
        # One resume clears a nondeterminism park and retries a stuck compensation.
        self.parked = False
        if self.status == S.COMPENSATION_STUCK:
            self._move(S.COMPENSATING)
            self.stuck_steps = ()
        # What parked it is over: the saga reports the error of where it goes back to
        # (why it compensates, or a held reply's), until a new one.
        self.error = self.cause if self.status == S.COMPENSATING else None
        self.settle_held()

    def _on_key_queued(self, event: KeyQueued) -> None:
        self.key = KeyHold(event.key, behind=tuple(event.behind), position=event.position)

    def _on_continued(self, event: RunContinued) -> None:
        """The run ended by continuing as new: the next begins with nothing in flight
        (``continue_as_new`` is refused while anything is), the deadline, a passed pivot
        and a held key kept, and what a reader of one run needs from the runs before."""
        self.run = event.run
        self.current_step = None
        self.inflight = {}
        self.timers = {k: t for k, t in self.timers.items() if k == DEADLINE_TIMER}
        self.issued_ids = NO_IDS
        self.seen_signals = NO_IDS
        for signal_id in event.seen_signals:
            self.seen_signals = with_id(self.seen_signals, signal_id)
        if event.pivot_step is not None:
            self.pivot_step, self.past_pivot = event.pivot_step, True
            self.timers.pop(DEADLINE_TIMER, None)
        if event.key is not None:
            self.key = KeyHold(event.key, held=True)

    def _on_key_acquired(self, event: KeyAcquired) -> None:
        self.key = KeyHold(event.key, held=True)

    def _on_ended(
        self, event: SagaCompleted | SagaFailed | SagaCompensated | SagaCancelled
    ) -> None:
        self._move(END_STATUS[type(event)])
        if isinstance(event, SagaCompleted):
            self.output, self.error = event.output, None
        elif isinstance(event, SagaFailed):
            self.error = event.error
        # (compensated, cancelled: the error compensation began with stands)
        self.inflight.clear()
        self.timers.clear()
        self.parked_steps = NO_PARKED
        self.event_waits = NO_WAITS


#: How each kind of event is folded (``Fold.apply``; the decision core looks an input's
#: up with what it does to the code, ``_inputs.apply_input``).
FOLD_HANDLERS: dict[type[Event], Callable[[Fold, Any], Settled]] = {
    SagaStarted: Fold._on_started,
    CommandIssued: Fold._on_issued,
    CompensationIssued: Fold._on_issued,
    ReplyReceived: Fold._on_reply,
    AttemptTimedOut: Fold._on_reply,
    InvalidReplyReceived: Fold._on_held,
    TimerStarted: Fold._on_timer_started,
    TimerFired: Fold._on_timer_fired,
    SignalReceived: Fold._on_signal,
    UndoRequested: Fold._on_undo,
    StepSkipped: Fold._on_skipped,
    RetryRequested: Fold._on_retry,
    CompensationStarted: Fold._on_compensation_started,
    CompensationStuck: Fold._on_stuck,
    StepParked: Fold._on_step_parked,
    StepAbandoned: Fold._on_abandoned,
    PivotPassed: Fold._on_pivot,
    SagaParked: Fold._on_parked,
    SagaResumed: Fold._on_resumed,
    KeyQueued: Fold._on_key_queued,
    KeyAcquired: Fold._on_key_acquired,
    SagaCompleted: Fold._on_ended,
    SagaFailed: Fold._on_ended,
    SagaCompensated: Fold._on_ended,
    SagaCancelled: Fold._on_ended,
    EventAwaited: Fold._on_event_awaited,
    DomainEventReceived: Fold._on_domain_event,
    CallbackAwaited: Fold._on_callback_awaited,
    CallbackReceived: Fold._on_callback,
    RunContinued: Fold._on_continued,
}

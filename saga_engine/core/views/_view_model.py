"""The shape of a saga's view (:class:`SagaView`): what the admin API, the web page and
the CLI show of a saga, and the parts it is made of. Built by ``_view.saga_view_of`` from the
history; the admin API's schemas mirror these fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from saga_engine.core.history._events import ErrorInfo
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.views._segments import Segment
from saga_engine.kernel._serde import JsonDict


class WaitKind(StrEnum):
    """What kind of thing a saga waits for."""

    REPLY = "reply"  #: a participant's answer to a command sent
    SIGNAL = "signal"  #: a named signal (with a deadline if the wait has a timeout)
    EVENT = "event"  #: another service's domain event, by source and correlation key
    TIMER = "timer"  #: a durable sleep
    BACKOFF = "backoff"  #: the pause before a step's (or compensation's) next attempt
    OPERATOR = "operator"  #: a human: a held reply, a stuck compensation, a parked saga
    KEY = "key"  #: its concurrency key, held by other sagas (queued, FIFO per key)
    CHILD = "child"  #: a child saga's end (or its answer to an undo)
    CALLBACK = "callback"  #: a third party's call of a callback URL (``ctx.callback``)


class OwedState(StrEnum):
    OWED = "owed"  #: applied; undone if the saga fails or is cancelled
    IN_DOUBT = "in_doubt"  #: outcome unknown (in flight or timed out): owed if it stops now
    PENDING = "pending"  #: compensation begun, this one not sent yet
    COMPENSATING = "compensating"  #: sent, awaiting its reply
    STUCK = "stuck"  #: exhausted its retries: an operator retries, skips or resumes


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
    #: A back-off's cause: the error of the attempt it follows.
    last_error: str | None = None


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
    #: The compensation that exhausted its retries (while compensation_stuck): the first,
    #: when independent steps undone in parallel are stuck at once (all: ``stuck_steps``).
    stuck_step: str | None
    waiting_for: tuple[Wait, ...]
    segments: tuple[Segment, ...]
    #: What an operator can do now (what the engine would not refuse as a 409).
    actions: tuple[Action, ...]
    events: int
    started_at: datetime | None
    last_at: datetime | None
    #: The pivot step (once its command is issued), and whether it has succeeded: past
    #: it the saga only goes forward (no cancel, a step that cannot succeed parks).
    pivot_step: str | None = None
    past_pivot: bool = False
    #: Forward steps parked for an operator after they could not succeed.
    parked_steps: tuple[str, ...] = ()
    #: Every stuck compensation, in the order they got stuck (while compensation_stuck).
    stuck_steps: tuple[str, ...] = ()
    #: The run the view shows (``ctx.continue_as_new`` began it; the first is 1): its
    #: ``events`` are that run's, after the saga's ``saga_started``.
    run: int = 1

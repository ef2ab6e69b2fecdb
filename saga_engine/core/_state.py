"""One saga's state in the decision core, and the small rules every part of the core shares.

:class:`SagaState` holds everything that changes while a saga runs, declared once: its
history and the cursor replay has reached, its status and error, what its code waits
for (commands in flight, timers, signals), the compensations it owes, and the
deterministic loop its code runs on. Three modules work on it:

- ``_operations``: what the saga's ``ctx`` does (steps, timers, signals, side effects,
  patches), and the lifecycle around the user's ``run``: finishing, failing and
  compensating;
- ``_inputs``: an input from outside, refused, dropped or turned into its event, and
  applied;
- ``_runtime``: :class:`SagaRuntime`, the runner's façade over one state.

The methods here are what more than one of them needs: how an event moves the status
(:meth:`SagaState.track`), and how the code is stopped when the code deployed cannot
drive the saga (:meth:`SagaState.park`).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import deque
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from pydantic import BaseModel

from saga_engine.core._decision import DEADLINE_TIMER
from saga_engine.core._definition import SagaDefinition
from saga_engine.core._events import (
    TERMINAL_EVENTS,
    CommandIssued,
    CompensationIssued,
    CompensationSpec,
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
    UndoRequested,
)
from saga_engine.core._loop import DeterministicLoop
from saga_engine.core._status import SagaStatus, check_transition
from saga_engine.kernel._errors import DefinitionError, NondeterminismError, PermanentError
from saga_engine.kernel._serde import JsonDict

if TYPE_CHECKING:
    from saga_engine.core._context import SagaContext


class Halt(BaseException):
    """Unwinds saga code after nondeterminism; a BaseException so `except Exception` won't eat it."""


@dataclass(slots=True)
class InFlight:
    """A command sent and not answered yet."""

    event: CommandIssued | CompensationIssued
    future: asyncio.Future[ReplyReceived | None]  # None: the attempt timed out
    #: The step's reply model (``returns=``): a success reply must match it.
    returns: type[BaseModel] | None = None
    #: A success reply that did not match (or could not be stored): the step waits for
    #: an operator's retry or skip, and the saga is step_stuck while any is held.
    held: InvalidReplyReceived | None = None


@dataclass(slots=True)
class PendingTimer:
    fire_at: datetime
    future: asyncio.Future[None] | None = None
    #: Set for an attempt's timeout: the command it times out.
    command_id: str | None = None


@dataclass(frozen=True, slots=True)
class OwedCompensation:
    step: str
    spec: CompensationSpec
    #: The forward command ids the step issued: the compensation names them, so a
    #: participant can refuse a forward command that arrives after its compensation.
    forward_ids: tuple[str, ...] = ()


def timeout_timer_id(command_id: str, attempt: int) -> str:
    return f"timeout:{command_id}:{attempt}"


#: The empty value of the id sets of a state until their first id: four empty sets are most
#: of a kilobyte per saga in memory, and many sagas never fill some of them.
NO_IDS: frozenset[str] = frozenset()


def with_id(ids: AbstractSet[str], value: str) -> set[str]:
    """``ids`` with ``value`` added: the set itself, or a new one in place of NO_IDS."""
    out = ids if isinstance(ids, set) else set(ids)
    out.add(value)
    return out


_TERMINAL_STATUS = {
    "saga_completed": SagaStatus.COMPLETED,
    "saga_failed": SagaStatus.FAILED,
    "saga_compensated": SagaStatus.COMPENSATED,
    "saga_cancelled": SagaStatus.CANCELLED,
}


class SagaState:
    """Everything about one saga that changes while it runs. No I/O, no clock."""

    # Slots, not an instance dict: an engine holds up to engine.cache_size of these, and
    # a dict of three dozen attributes is a kilobyte and a half of each.
    __slots__ = (
        "cancel_message", "cancel_reason", "clock", "closing", "counters", "ctx", "current_step",
        "cursor", "definition", "error", "history", "inflight", "issued_ids", "last_attempt",
        "lifecycle", "loop", "new", "nondeterminism", "now", "output", "owed", "parked",
        "patches", "resume_waiter", "rng", "saga_id", "saga_type", "seen_signals",
        "signal_waiters", "signals", "skipped_ids", "status", "step_names", "stuck_step",
        "timers", "trace_context", "undo_ids", "undo_waiter", "user_task",
    )  # fmt: skip

    def __init__(
        self, definition: SagaDefinition, saga_id: str, ctx: SagaContext, clock: datetime
    ) -> None:
        self.definition = definition
        self.saga_id = saga_id
        self.saga_type = definition.name
        self.trace_context: dict[str, str] = {}
        #: The last attempt sent per forward command id (for a compensation's span link).
        self.last_attempt: dict[str, int] = {}
        #: The saga's time: the time of the input its code reacts to (``ctx.now()``).
        self.now: datetime = datetime.min
        #: The runner's time for the input being handled (for a replay, the time it
        #: rebuilds the saga): what a park is stamped with.
        self.clock = clock
        self.output: JsonDict | None = None

        # mypy sees AbstractEventLoop's I/O methods as abstract; saga code needs none of them.
        self.loop = DeterministicLoop()  # type: ignore[abstract]
        self.ctx = ctx
        self.history: list[Event] = []
        self.cursor = 0  # events of history already consumed by the code
        #: The events of the decision being made (appended to history too).
        self.new: list[Event] = []

        # The status the code's own events reached, and an overlay for "parked as
        # nondeterministic", which stops the code without changing where it stands.
        self.status = SagaStatus.RUNNING
        self.parked = False
        self.current_step: str | None = None
        self.error: ErrorInfo | None = None
        #: Why the code deployed cannot drive the saga, once it cannot (it is parked).
        self.nondeterminism: PermanentError | None = None

        self.inflight: dict[str, InFlight] = {}
        self.issued_ids: AbstractSet[str] = NO_IDS
        self.timers: dict[str, PendingTimer] = {}
        #: Signals received before the code waited for them, per name.
        self.signals: dict[str, deque[JsonDict]] = {}
        self.signal_waiters: dict[str, asyncio.Future[JsonDict | None]] = {}
        self.seen_signals: AbstractSet[str] = NO_IDS
        #: The compensations owed, in the order their steps were applied.
        self.owed: list[OwedCompensation] = []
        self.step_names: AbstractSet[str] = NO_IDS
        self.counters: dict[str, itertools.count[int]] = {}
        self.patches: dict[str, bool] = {}
        #: Seeded on first use (see ``_operations``): most sagas never ask for randomness.
        self.rng: random.Random | None = None

        self.lifecycle: asyncio.Task[None] | None = None
        self.user_task: asyncio.Task[Any] | None = None
        self.cancel_reason: Literal["cancel", "deadline", "forced"] | None = None
        self.cancel_message = ""
        self.closing = False
        #: While a compensation is stuck: what the operator decides ("retry" or "skip").
        self.resume_waiter: asyncio.Future[str] | None = None
        self.stuck_step: str | None = None
        self.skipped_ids: AbstractSet[str] = NO_IDS
        #: A completed child waits here for its parent's undo (``UndoRequested``).
        self.undo_waiter: asyncio.Future[None] | None = None
        #: The parent's compensation commands this child was asked to undo by.
        self.undo_ids: AbstractSet[str] = NO_IDS

    # ------------------------------------------------------------------ queries

    @property
    def replaying(self) -> bool:
        return self.cursor < len(self.history)

    @property
    def dead(self) -> bool:
        """Parked as nondeterministic: the code cannot go on until a fixed deploy."""
        return self.nondeterminism is not None or self.parked

    @property
    def going_forward(self) -> bool:
        """Still going forward: running, or running with a step held for an operator."""
        return self.status in (SagaStatus.RUNNING, SagaStatus.STEP_STUCK)

    def waiting_forward(self, step: str) -> InFlight | None:
        """The forward command of ``step`` waiting for its reply, if any."""
        return next(
            (
                f
                for f in self.inflight.values()
                if f.event.step == step and isinstance(f.event, CommandIssued)
            ),
            None,
        )

    def retry_timer(self, step: str) -> str | None:
        """The timer of ``step`` (or of its compensation) waiting out a back-off, if any."""
        prefixes = (f"retry:{step}:", f"retry:compensate:{step}:")
        return next((t for t in self.timers if t.startswith(prefixes)), None)

    def steps_in_flight(self) -> list[str]:
        return sorted({f.event.step for f in self.inflight.values()})

    def describe_waiting(self) -> str:
        waits = [
            f"a reply to step {f.event.step!r}"
            if f.held is None
            else f"an operator for step {f.event.step!r} (its reply is held)"
            for f in self.inflight.values()
        ]
        waits += [f"timer {tid!r}" for tid in self.timers if tid != DEADLINE_TIMER]
        waits += [f"signal {name!r}" for name in self.signal_waiters]
        if self.status.is_terminal:
            return f"nothing (the saga already ended {self.status.value})"
        return "nothing more; the code waits for " + (", ".join(waits) or "nothing")

    # ------------------------------------------------------------------ status

    def track(self, event: Event) -> None:
        """Moves the status (and error, current step, output) for an event, recorded or new."""
        new = self.status
        if isinstance(event, CommandIssued):
            self.last_attempt[event.command_id] = event.attempt
        if isinstance(event, CompensationStarted):
            new = SagaStatus.COMPENSATING
            self.error = event.error
        elif isinstance(event, CompensationStuck):
            new = SagaStatus.COMPENSATION_STUCK
            self.error = event.error
        elif isinstance(event, SagaParked):
            self.parked = True
            self.error = event.error
        elif isinstance(event, InvalidReplyReceived):
            new = SagaStatus.STEP_STUCK
            self.error = event.error
        elif (
            isinstance(event, StepSkipped | RetryRequested)
            and self.status == SagaStatus.COMPENSATION_STUCK
            and self.stuck_step == event.step
        ):
            new = SagaStatus.COMPENSATING  # the operator unblocked the stuck compensation
            self.error = self.compensation_cause()  # no longer stuck
        elif isinstance(event, SagaResumed):
            # One resume clears a nondeterminism park and retries a stuck compensation
            # (the lifecycle's waiter is woken by the same event when it is applied).
            self.parked = False
            if self.status == SagaStatus.COMPENSATION_STUCK:
                new = SagaStatus.COMPENSATING
            # What parked it is over: the saga reports the error of where it goes back
            # to (a held reply's is set again once applied), until a new one.
            self.error = self.compensation_cause() if new == SagaStatus.COMPENSATING else None
        elif isinstance(event, SagaCompleted):
            new = SagaStatus.COMPLETED
            self.output = event.output
        elif isinstance(event, SagaFailed):
            new = SagaStatus.FAILED
            self.error = event.error
        elif isinstance(event, SagaCompensated):
            new = SagaStatus.COMPENSATED
        elif isinstance(event, SagaCancelled):
            new = SagaStatus.CANCELLED
        elif isinstance(event, CommandIssued | CompensationIssued):
            self.current_step = event.step
            self.issued_ids = with_id(self.issued_ids, event.command_id)
        elif isinstance(event, UndoRequested):
            self.undo_ids = with_id(self.undo_ids, event.command_id)
        self.status = check_transition(self.status, new)

    def settle_held(self) -> None:
        """step_stuck lasts while a reply is held: when none is (released by an operator,
        or its step ended another way), the saga is running again."""
        if self.status != SagaStatus.STEP_STUCK or self.nondeterminism is not None:
            return
        held = [f.held for f in self.inflight.values() if f.held is not None]
        if held:
            self.error = held[0].error
            return
        self.status = check_transition(self.status, SagaStatus.RUNNING)
        if self.error is not None and self.error.type == "InvalidReply":
            self.error = None

    def compensation_cause(self) -> ErrorInfo | None:
        """Why the saga compensates: the error its compensation_started recorded (a saga
        starts compensating once)."""
        started = next(
            (e for e in reversed(self.history) if isinstance(e, CompensationStarted)), None
        )
        return started.error if started is not None else None

    # ------------------------------------------------------------------ parking

    def nondeterministic(self, index: int | None, expected: str, actual: str) -> None:
        """The code no longer matches the history at ``index``: the saga is parked."""
        seq = index + 1 if index is not None and index < len(self.history) else None
        nd = NondeterminismError(self.saga_id, seq, expected, actual)
        self.park(
            nd,
            "nondeterministic",
            ErrorInfo(
                type="NondeterminismError",
                message=str(nd),
                details={"seq": seq, "expected": expected, "actual": actual},
            ),
        )

    def definition_error(self, message: str) -> NoReturn:
        """The saga's code cannot run as written. A bug in the code is not a reason to
        undo a business transaction: the saga is parked (like a nondeterministic one) for
        a fixed deploy and a resume, and the code is unwound without compensating."""
        error = DefinitionError(message)
        self.park(
            error,
            "definition_error",
            ErrorInfo(type="DefinitionError", message=message, step=self.current_step),
        )
        raise Halt

    def park(
        self,
        cause: PermanentError,
        reason: Literal["nondeterministic", "definition_error"],
        error: ErrorInfo,
    ) -> None:
        """Stops the code where it stands: the code deployed cannot drive this saga."""
        self.nondeterminism = cause
        self.loop.discard()
        self.inflight.clear()
        self.timers.clear()
        ended = next((e for e in reversed(self.history) if isinstance(e, TERMINAL_EVENTS)), None)
        if ended is not None:
            # The saga finished long ago under the old code: report the mismatch, but a
            # finished saga stays finished; nothing of it will ever run again.
            self.status = _TERMINAL_STATUS[ended.kind]
            return
        self.parked = True
        if isinstance(self.history[-1], SagaParked):
            return  # parked already, by an earlier deploy: nothing new to record
        parked = SagaParked(
            # When the runner parks it (live: the input's time; rebuilt: the runner's
            # clock, not the replayed time), and never before the history it ends.
            at=max(self.clock, self.history[-1].at),
            reason=reason,
            error=error,
        )
        # The code is abandoned where it stands; the recorded history stays as it was
        # and the marker goes at its end.
        self.history.append(parked)
        self.new.append(parked)
        self.error = parked.error

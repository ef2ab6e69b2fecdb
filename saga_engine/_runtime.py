"""The decision core: feed a saga's inputs in, get the events to record and the commands to send.

No I/O happens here. A :class:`SagaRuntime` holds one saga's code running on a
:class:`DeterministicLoop`. The runner (the engine) gives it one input at a time
(a reply, a timer firing, a signal, a cancel request) and gets back a
:class:`Decision`: the events to append to the history — the input first, then every
intent the code produced in reaction — and the commands to send once they are
durable.

Rebuilding a saga (:meth:`SagaRuntime.replay`) re-runs its code against its
history: recorded inputs are delivered again in order, and every intent the code
produces must match the recorded one. A difference raises no exception into the
saga: the runtime stops, reports a :class:`NondeterminismError` and asks for a
``SagaParked`` event, leaving the history intact for a fixed deploy to resume.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
from collections import deque
from datetime import datetime
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from saga_engine._context import SagaContext
from saga_engine._decision import (
    DEADLINE_TIMER,
    Cancel,
    Decision,
    DropReason,
    ForceCompensate,
    Inbound,
    OutboundCommand,
    Reply,
    Resume,
    RetryStep,
    Signal,
    Skip,
    StartSaga,
    TimerDue,
)
from saga_engine._definition import SagaDefinition
from saga_engine._errors import InvalidTransition, NondeterminismError, SerializationError
from saga_engine._events import (
    TERMINAL_EVENTS,
    AttemptTimedOut,
    CancelRequested,
    CommandIssued,
    CompensationForced,
    CompensationIssued,
    CompensationStarted,
    CompensationStuck,
    ErrorInfo,
    Event,
    ReplyReceived,
    RetryRequested,
    SagaCancelled,
    SagaCompensated,
    SagaCompleted,
    SagaFailed,
    SagaParked,
    SagaResumed,
    SagaStarted,
    SignalReceived,
    StepSkipped,
    TimerFired,
)
from saga_engine._loop import DeterministicLoop
from saga_engine._operations import SagaOperations, _Halt, _InFlight, _Owed, _Timer
from saga_engine._serde import JsonDict
from saga_engine._status import SagaStatus, check_transition
from saga_engine._store import Projection

M = TypeVar("M", bound=BaseModel)

_TERMINAL_STATUS = {
    "saga_completed": SagaStatus.COMPLETED,
    "saga_failed": SagaStatus.FAILED,
    "saga_compensated": SagaStatus.COMPENSATED,
    "saga_cancelled": SagaStatus.CANCELLED,
}


class SagaRuntime(SagaOperations):
    """One saga's code and state, driven by inputs. Pure: no clock, no I/O."""

    def __init__(self, definition: SagaDefinition, saga_id: str) -> None:
        self.definition = definition
        self.saga_id = saga_id
        self.saga_type = definition.name
        self.trace_context: dict[str, str] = {}
        #: The last attempt sent per forward command id (for a compensation's span link).
        self._last_attempt: dict[str, int] = {}
        self.now: datetime = datetime.min
        self.output: JsonDict | None = None

        # mypy sees AbstractEventLoop's I/O methods as abstract; saga code needs none of them.
        self._loop = DeterministicLoop()  # type: ignore[abstract]
        self._ctx = SagaContext(self)
        self._history: list[Event] = []
        self._cursor = 0  # events of _history already consumed by the code
        self._new: list[Event] = []

        # The status the code's own events reached, and an overlay for "parked as
        # nondeterministic", which stops the code without changing where it stands.
        self._status = SagaStatus.RUNNING
        self._parked = False
        self._current_step: str | None = None
        self._error: ErrorInfo | None = None
        self._nd: NondeterminismError | None = None

        self._inflight: dict[str, _InFlight] = {}
        self._issued_ids: set[str] = set()
        self._timers: dict[str, _Timer] = {}
        self._signals: dict[str, deque[JsonDict]] = {}
        self._signal_waiters: dict[str, asyncio.Future[JsonDict | None]] = {}
        self._seen_signals: set[str] = set()
        self._stack: list[_Owed] = []
        self._step_names: set[str] = set()
        self._counters: dict[str, itertools.count[int]] = {}
        self._patches: dict[str, bool] = {}
        self._rng = random.Random(hashlib.sha256(saga_id.encode()).digest())

        self._lifecycle: asyncio.Task[None] | None = None
        self._user_task: asyncio.Task[Any] | None = None
        self._cancel_reason: Literal["cancel", "deadline", "forced"] | None = None
        self._cancel_message = ""
        self._closing = False
        self._resume_waiter: asyncio.Future[str] | None = None
        self._stuck_step: str | None = None
        self._skipped_ids: set[str] = set()

    # ------------------------------------------------------------------ construction

    @classmethod
    def start(cls, definition: SagaDefinition, start: StartSaga) -> tuple[SagaRuntime, Decision]:
        """A brand-new saga: validates the input, records SagaStarted, runs to its first wait."""
        try:
            definition.input_type.model_validate(start.input)
        except ValidationError as exc:
            raise SerializationError(
                f"input for saga {definition.name!r} does not match "
                f"{definition.input_type.__name__}: {exc}"
            ) from exc
        rt = cls(definition, start.saga_id)
        started = SagaStarted(
            at=start.at,
            saga_type=definition.name,
            input=start.input,
            idempotency_key=start.idempotency_key,
            deadline_at=start.deadline_at,
            trace_context=dict(start.trace_context),
        )
        rt._take_input(started)
        return rt, rt._decision()

    @classmethod
    def replay(
        cls, definition: SagaDefinition, saga_id: str, history: list[Event]
    ) -> tuple[SagaRuntime, Decision]:
        """Rebuilds a saga from its history. The decision holds anything owed past the end."""
        if not history or not isinstance(history[0], SagaStarted):
            raise SerializationError(f"saga {saga_id}: a history must begin with saga_started")
        rt = cls(definition, saga_id)
        rt._history = list(history)
        while rt._cursor < len(rt._history) and rt._nd is None:
            event = rt._history[rt._cursor]
            if event.is_intent:
                waiting = rt._describe_waiting()
                rt._nondeterministic(rt._cursor, event.describe(), waiting)
                break
            rt._cursor += 1
            rt._deliver(event)
        return rt, rt._decision()

    # ------------------------------------------------------------------ the runner's API

    @property
    def status(self) -> SagaStatus:
        return SagaStatus.NONDETERMINISTIC if self._parked else self._status

    @property
    def last_seq(self) -> int:
        """The sequence number of the newest event, committed or not."""
        return len(self._history)

    @property
    def replaying(self) -> bool:
        return self._cursor < len(self._history)

    @property
    def dead(self) -> bool:
        """Parked as nondeterministic: the code cannot go on until a fixed deploy."""
        return self._nd is not None or self._parked

    @property
    def history(self) -> list[Event]:
        return list(self._history)

    def pending_timers(self) -> dict[str, datetime]:
        return {tid: t.fire_at for tid, t in self._timers.items()}

    def next_wakeup(self) -> datetime | None:
        return min((t.fire_at for t in self._timers.values()), default=None)

    def outstanding_commands(self) -> list[OutboundCommand]:
        """Commands sent but not answered: a recovering owner sends them again, same ids."""
        return [self._outbound(f.event) for f in self._inflight.values()]

    def owed_compensations(self) -> list[str]:
        return [o.step for o in reversed(self._stack)]

    def handle(self, inbound: Inbound) -> Decision:
        """Applies one input and returns what to record and send.

        Raises InvalidTransition when the input makes no sense in the current status.
        """
        self._new = []
        if self._status.is_terminal:
            if isinstance(inbound, Reply):
                known = inbound.command_id in self._issued_ids
                return self._decision(
                    dropped=DropReason.DUPLICATE_REPLY if known else DropReason.UNKNOWN_COMMAND
                )
            if isinstance(inbound, TimerDue):
                return self._decision(dropped=DropReason.STALE_TIMER)
            raise InvalidTransition(
                f"saga {self.saga_id} is {self._status.value}; it accepts no "
                f"{type(inbound).__name__.lower()} any more"
            )
        event = self._to_event(inbound)
        if isinstance(event, DropReason):
            return self._decision(dropped=event)
        self._history.append(event)
        self._new.append(event)
        self._cursor += 1
        self._deliver(event)
        return self._decision()

    def close(self) -> None:
        """Releases the saga's code (its coroutines) without running any more of it."""
        self._closing = True
        self._loop.discard()

    def parse(self, model: type[M], payload: JsonDict, what: str) -> M:
        try:
            return model.model_validate(payload)
        except ValidationError as exc:
            raise SerializationError(f"{what} does not match {model.__name__}: {exc}") from exc

    # ------------------------------------------------------------------ inputs

    def _to_event(self, inbound: Inbound) -> Event | DropReason:
        at = inbound.at
        if self.dead:
            # Replies and timers are dropped: on resume, outstanding commands are re-sent
            # under the same ids (participants repeat their stored replies) and timers are
            # re-armed. Signals and cancels are refused, so their sender knows; recording
            # them here would put inputs in the history that no code reacted to.
            if isinstance(inbound, Resume):
                if self._nd is not None:
                    raise InvalidTransition(
                        f"saga {self.saga_id} is still nondeterministic with the code deployed "
                        f"here ({self._nd}); deploy code that replays its history, then resume"
                    )
                return SagaResumed(at=at, principal=inbound.principal, reason=inbound.reason)
            if isinstance(inbound, Signal | Cancel | ForceCompensate | Skip | RetryStep):
                raise InvalidTransition(
                    f"saga {self.saga_id} is parked as nondeterministic; resume it after "
                    f"deploying a fix before sending it a {type(inbound).__name__.lower()}"
                )
            return DropReason.PARKED
        if isinstance(inbound, Reply):
            inflight = self._inflight.get(inbound.command_id)
            if inflight is None:
                if inbound.command_id in self._issued_ids:
                    return DropReason.DUPLICATE_REPLY
                return DropReason.UNKNOWN_COMMAND
            return ReplyReceived(
                at=at,
                step=inflight.event.step,
                command_id=inbound.command_id,
                outcome=inbound.outcome,
                compensation=isinstance(inflight.event, CompensationIssued),
                payload=inbound.payload,
                error=inbound.error,
            )
        if isinstance(inbound, TimerDue):
            timer = self._timers.get(inbound.timer_id)
            if timer is None:
                return DropReason.STALE_TIMER
            if timer.command_id is not None:
                cmd = self._inflight[timer.command_id].event
                return AttemptTimedOut(
                    at=at,
                    step=cmd.step,
                    command_id=cmd.command_id,
                    attempt=cmd.attempt,
                    compensation=isinstance(cmd, CompensationIssued),
                )
            return TimerFired(at=at, timer_id=inbound.timer_id)
        if isinstance(inbound, Signal):
            if inbound.signal_id in self._seen_signals:
                return DropReason.DUPLICATE_SIGNAL
            return SignalReceived(
                at=at,
                signal_id=inbound.signal_id,
                name=inbound.name,
                payload=inbound.payload,
                principal=inbound.principal,
                reason=inbound.reason,
            )
        if isinstance(inbound, Cancel):
            if self._status != SagaStatus.RUNNING or self._cancel_reason is not None:
                raise InvalidTransition(
                    f"saga {self.saga_id} is {self._status.value}: it is already undoing its "
                    "steps, so there is nothing to cancel"
                )
            return CancelRequested(at=at, reason=inbound.reason, principal=inbound.principal)
        if isinstance(inbound, ForceCompensate):
            if self._status != SagaStatus.RUNNING or self._cancel_reason is not None:
                raise InvalidTransition(
                    f"saga {self.saga_id} is {self._status.value}: it is already undoing its "
                    "steps, so there is nothing to force"
                )
            return CompensationForced(at=at, reason=inbound.reason, principal=inbound.principal)
        if isinstance(inbound, Skip):
            return self._skip_event(inbound)
        if isinstance(inbound, RetryStep):
            return self._retry_event(inbound)
        if isinstance(inbound, Resume):
            if self._status != SagaStatus.COMPENSATION_STUCK:
                raise InvalidTransition(
                    f"saga {self.saga_id} is {self._status.value}; only a saga whose "
                    "compensation is stuck (or that is parked as nondeterministic) can be resumed"
                )
            return SagaResumed(at=at, principal=inbound.principal, reason=inbound.reason)
        raise TypeError(f"unknown input {inbound!r}")

    def _in_flight(self) -> list[str]:
        return sorted({f.event.step for f in self._inflight.values()})

    def _skip_event(self, inbound: Skip) -> Event:
        if self._status == SagaStatus.COMPENSATION_STUCK and self._stuck_step == inbound.step:
            return StepSkipped(
                at=inbound.at, step=inbound.step, compensation=True, payload=inbound.payload,
                principal=inbound.principal, reason=inbound.reason,
            )  # fmt: skip
        forward = [
            f for f in self._inflight.values()
            if f.event.step == inbound.step and isinstance(f.event, CommandIssued)
        ]  # fmt: skip
        if self._status == SagaStatus.RUNNING and forward and self._cancel_reason is None:
            return StepSkipped(
                at=inbound.at, step=inbound.step, payload=inbound.payload,
                principal=inbound.principal, reason=inbound.reason,
            )  # fmt: skip
        stuck = f"; the stuck compensation is {self._stuck_step!r}" if self._stuck_step else ""
        raise InvalidTransition(
            f"step {inbound.step!r} of saga {self.saga_id} ({self._status.value}) is neither "
            f"waiting for a reply nor a stuck compensation; steps waiting for a reply: "
            f"{self._in_flight() or 'none'}{stuck}"
        )

    def _retry_event(self, inbound: RetryStep) -> Event:
        waiting = self._status == SagaStatus.COMPENSATION_STUCK and self._stuck_step == inbound.step
        if waiting or self._retry_timer(inbound.step) is not None:
            return RetryRequested(
                at=inbound.at, step=inbound.step, principal=inbound.principal,
                reason=inbound.reason,
            )  # fmt: skip
        raise InvalidTransition(
            f"step {inbound.step!r} of saga {self.saga_id} ({self._status.value}) is not waiting "
            f"to retry; steps waiting for a reply: {self._in_flight() or 'none'}"
        )

    def _retry_timer(self, step: str) -> str | None:
        prefixes = (f"retry:{step}:", f"retry:compensate:{step}:")
        return next((t for t in self._timers if t.startswith(prefixes)), None)

    def _take_input(self, event: Event) -> None:
        self._history.append(event)
        self._new.append(event)
        self._cursor += 1
        self._deliver(event)

    def _deliver(self, event: Event) -> None:
        """Applies an input event (live or replayed) and runs the code until it waits."""
        self.now = event.at
        self._track(event)
        try:
            self._apply(event)
        except _Halt:
            return
        self._run()

    def _apply(self, event: Event) -> None:
        if isinstance(event, SagaStarted):
            self.trace_context = dict(event.trace_context)
            if event.deadline_at is not None:
                self._timers[DEADLINE_TIMER] = _Timer(fire_at=event.deadline_at)
            self._lifecycle = self._loop.create_task(self._run_lifecycle(event))
        elif isinstance(event, ReplyReceived | AttemptTimedOut):
            inflight = self._inflight.get(event.command_id)
            if inflight is None or inflight.future.done():
                self._nondeterministic(
                    self._cursor - 1,
                    event.describe(),
                    f"no command {event.command_id} waiting ({self._describe_waiting()})",
                )
                raise _Halt
            inflight.future.set_result(event if isinstance(event, ReplyReceived) else None)
        elif isinstance(event, TimerFired):
            timer = self._timers.pop(event.timer_id, None)
            if event.timer_id == DEADLINE_TIMER:
                self._request_cancel("deadline", "the saga's deadline passed")
            elif timer is not None and timer.future is not None and not timer.future.done():
                timer.future.set_result(None)
        elif isinstance(event, SignalReceived):
            self._seen_signals.add(event.signal_id)
            waiter = self._signal_waiters.get(event.name)
            if waiter is not None and not waiter.done():
                waiter.set_result(event.payload)
            else:
                self._signals.setdefault(event.name, deque()).append(event.payload)
        elif isinstance(event, CancelRequested):
            self._request_cancel("cancel", event.reason)
        elif isinstance(event, CompensationForced):
            self._request_cancel("forced", f"forced by {event.principal}: {event.reason}")
        elif isinstance(event, StepSkipped):
            self._apply_skip(event)
        elif isinstance(event, RetryRequested):
            if self._stuck_step == event.step and self._resume_waiter is not None:
                if not self._resume_waiter.done():
                    self._resume_waiter.set_result("retry")
            else:
                timer_id = self._retry_timer(event.step)
                timer = self._timers.pop(timer_id) if timer_id else None
                if timer is not None and timer.future is not None and not timer.future.done():
                    timer.future.set_result(None)
        elif (
            isinstance(event, SagaResumed)
            and self._resume_waiter is not None
            and not self._resume_waiter.done()
        ):
            self._resume_waiter.set_result("retry")

    def _apply_skip(self, event: StepSkipped) -> None:
        if event.compensation:
            if self._resume_waiter is not None and not self._resume_waiter.done():
                self._resume_waiter.set_result("skip")
            return
        for inflight in list(self._inflight.values()):
            if inflight.event.step == event.step and not inflight.future.done():
                self._skipped_ids.add(inflight.event.command_id)
                inflight.future.set_result(
                    ReplyReceived(
                        at=event.at,
                        step=event.step,
                        command_id=inflight.event.command_id,
                        outcome="success",
                        payload=event.payload,
                    )
                )
                return

    def _request_cancel(
        self, reason: Literal["cancel", "deadline", "forced"], message: str
    ) -> None:
        if self._cancel_reason is not None or self._closing:
            return
        self._cancel_reason = reason
        self._cancel_message = message
        if self._user_task is not None and not self._user_task.done():
            self._user_task.cancel()

    def _run(self) -> None:
        self._loop.run_until_quiescent(should_stop=lambda: self._nd is not None)
        lifecycle = self._lifecycle
        if (
            self._nd is None
            and lifecycle is not None
            and lifecycle.done()
            and not lifecycle.cancelled()
            and lifecycle.exception() is not None
            and not isinstance(lifecycle.exception(), _Halt)
        ):
            raise RuntimeError("saga lifecycle crashed") from lifecycle.exception()

    # ------------------------------------------------------------------ status

    def _track(self, event: Event) -> None:
        new = self._status
        if isinstance(event, CommandIssued):
            self._last_attempt[event.command_id] = event.attempt
        if isinstance(event, CompensationStarted):
            new = SagaStatus.COMPENSATING
            self._error = event.error
        elif isinstance(event, CompensationStuck):
            new = SagaStatus.COMPENSATION_STUCK
            self._error = event.error
        elif isinstance(event, SagaParked):
            self._parked = True
            self._error = event.error
        elif (
            isinstance(event, StepSkipped | RetryRequested)
            and self._status == SagaStatus.COMPENSATION_STUCK
            and self._stuck_step == event.step
        ):
            new = SagaStatus.COMPENSATING  # the operator unblocked the stuck compensation
        elif isinstance(event, SagaResumed):
            # One resume clears a nondeterminism park and retries a stuck compensation
            # (the lifecycle's waiter is woken by the same event in _apply).
            self._parked = False
            if self._status == SagaStatus.COMPENSATION_STUCK:
                new = SagaStatus.COMPENSATING
        elif isinstance(event, SagaCompleted):
            new = SagaStatus.COMPLETED
            self.output = event.output
        elif isinstance(event, SagaFailed):
            new = SagaStatus.FAILED
            self._error = event.error
        elif isinstance(event, SagaCompensated):
            new = SagaStatus.COMPENSATED
        elif isinstance(event, SagaCancelled):
            new = SagaStatus.CANCELLED
        elif isinstance(event, CommandIssued | CompensationIssued):
            self._current_step = event.step
            self._issued_ids.add(event.command_id)
        self._status = check_transition(self._status, new)

    def _nondeterministic(self, index: int | None, expected: str, actual: str) -> None:
        seq = index + 1 if index is not None and index < len(self._history) else None
        self._nd = NondeterminismError(self.saga_id, seq, expected, actual)
        self._loop.discard()
        self._inflight.clear()
        self._timers.clear()
        ended = next((e for e in reversed(self._history) if isinstance(e, TERMINAL_EVENTS)), None)
        if ended is not None:
            # The saga finished long ago under the old code: report the mismatch, but a
            # finished saga stays finished; nothing of it will ever run again.
            self._status = _TERMINAL_STATUS[ended.kind]
            return
        self._parked = True
        if isinstance(self._history[-1], SagaParked):
            return  # parked already, by an earlier deploy: nothing new to record
        parked = SagaParked(
            # Never stamped before the history it ends.
            at=max(self.now, self._history[-1].at),
            error=ErrorInfo(
                type="NondeterminismError",
                message=str(self._nd),
                details={"seq": seq, "expected": expected, "actual": actual},
            ),
        )
        # The code is abandoned where it stands; the recorded history stays as it was
        # and the marker goes at its end.
        self._history.append(parked)
        self._new.append(parked)
        self._error = parked.error

    def _describe_waiting(self) -> str:
        waits = [f"a reply to step {f.event.step!r}" for f in self._inflight.values()]
        waits += [f"timer {tid!r}" for tid in self._timers if tid != DEADLINE_TIMER]
        waits += [f"signal {name!r}" for name in self._signal_waiters]
        if self._status.is_terminal:
            return f"nothing (the saga already ended {self._status.value})"
        return "nothing more; the code waits for " + (", ".join(waits) or "nothing")

    def _decision(self, dropped: DropReason | None = None) -> Decision:
        commands = [
            self._outbound(e)
            for e in self._new
            if isinstance(e, CommandIssued | CompensationIssued)
        ]
        events, self._new = self._new, []
        ended = self._status.is_terminal or self.dead
        projection = Projection(
            status=self.status,
            current_step=self._current_step,
            next_wakeup=None if ended else self.next_wakeup(),
            error=self._error.model_dump(mode="json") if self._error else None,
        )
        return Decision(events, commands, projection, dropped, self._nd)

    def _outbound(self, event: CommandIssued | CompensationIssued) -> OutboundCommand:
        return OutboundCommand(
            saga_id=self.saga_id,
            saga_type=self.saga_type,
            step=event.step,
            participant=event.participant,
            command_type=event.command_type,
            payload=event.payload,
            command_id=event.command_id,
            attempt=event.attempt,
            compensation=isinstance(event, CompensationIssued),
            trace_context=self.trace_context,
            compensates=tuple(event.compensates) if isinstance(event, CompensationIssued) else (),
            compensates_attempts=(
                tuple(self._last_attempt.get(c, 1) for c in event.compensates)
                if isinstance(event, CompensationIssued)
                else ()
            ),
        )

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
import itertools
from collections import deque
from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import Any, Literal, NoReturn, TypeVar

from pydantic import BaseModel

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
    SignalInput,
    Skip,
    StartSaga,
    TimerDue,
)
from saga_engine._definition import SagaDefinition, Signal
from saga_engine._errors import (
    DefinitionError,
    InvalidPayload,
    InvalidTransition,
    NondeterminismError,
    PermanentError,
    SerializationError,
    UnstorableValue,
)
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
    InvalidReplyReceived,
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
from saga_engine._operations import (
    _NO_IDS,
    SagaOperations,
    _Halt,
    _InFlight,
    _Owed,
    _Timer,
    _with,
    timeout_timer_id,
)
from saga_engine._serde import (
    JsonDict,
    check_storable,
    storable_copy,
    unstorable,
    validate_payload,
)
from saga_engine._status import SagaStatus, check_transition
from saga_engine._store import Projection

M = TypeVar("M", bound=BaseModel)

_TERMINAL_STATUS = {
    "saga_completed": SagaStatus.COMPLETED,
    "saga_failed": SagaStatus.FAILED,
    "saga_compensated": SagaStatus.COMPENSATED,
    "saga_cancelled": SagaStatus.CANCELLED,
}


_INPUT_NAMES = {
    SignalInput: "signal", Cancel: "cancel", ForceCompensate: "force-compensate",
    Skip: "skip", RetryStep: "retry", Resume: "resume", Reply: "reply", TimerDue: "timer",
}  # fmt: skip


def _input_name(inbound: Inbound) -> str:
    """An input's name in messages, as operators know the actions."""
    return _INPUT_NAMES.get(type(inbound), type(inbound).__name__.lower())


class SagaRuntime(SagaOperations):
    """One saga's code and state, driven by inputs. Pure: no clock, no I/O."""

    __slots__ = ()  # the state is declared, as slots, by SagaOperations

    def __init__(self, definition: SagaDefinition, saga_id: str) -> None:
        self.definition = definition
        self.saga_id = saga_id
        self.saga_type = definition.name
        self.trace_context: dict[str, str] = {}
        #: The last attempt sent per forward command id (for a compensation's span link).
        self._last_attempt: dict[str, int] = {}
        self.now: datetime = datetime.min
        #: The runner's time for the input being handled (for a replay, the time it
        #: rebuilds the saga): what a park is stamped with. ``now`` is the saga's time.
        self._clock: datetime = datetime.min
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
        #: Why the code deployed cannot drive the saga, once it cannot (it is parked).
        self._nd: PermanentError | None = None

        self._inflight: dict[str, _InFlight] = {}
        self._issued_ids: AbstractSet[str] = _NO_IDS
        self._timers: dict[str, _Timer] = {}
        self._signals: dict[str, deque[JsonDict]] = {}
        self._signal_waiters: dict[str, asyncio.Future[JsonDict | None]] = {}
        self._seen_signals: AbstractSet[str] = _NO_IDS
        self._stack: list[_Owed] = []
        self._step_names: AbstractSet[str] = _NO_IDS
        self._counters: dict[str, itertools.count[int]] = {}
        self._patches: dict[str, bool] = {}
        self._rng_state = None  # see SagaOperations._rng

        self._lifecycle: asyncio.Task[None] | None = None
        self._user_task: asyncio.Task[Any] | None = None
        self._cancel_reason: Literal["cancel", "deadline", "forced"] | None = None
        self._cancel_message = ""
        self._closing = False
        self._resume_waiter: asyncio.Future[str] | None = None
        self._stuck_step: str | None = None
        self._skipped_ids: AbstractSet[str] = _NO_IDS

    # ------------------------------------------------------------------ construction

    @classmethod
    def start(cls, definition: SagaDefinition, start: StartSaga) -> tuple[SagaRuntime, Decision]:
        """A brand-new saga: validates the input, records SagaStarted, runs to its first wait.

        Raises InvalidPayload (UnstorableValue) naming each wrong field; nothing is recorded.
        """
        value = definition.validate_input(start.input)
        check_storable(
            {"saga_id": start.saga_id, "idempotency_key": start.idempotency_key}, "the start"
        )
        rt = cls(definition, start.saga_id)
        rt._clock = start.at
        started = SagaStarted(
            at=start.at,
            saga_type=definition.name,
            # Defaults filled in now, once: the code reads this input on every replay.
            input=value.model_dump(mode="json", by_alias=True),
            idempotency_key=start.idempotency_key,
            deadline_at=start.deadline_at,
            # Only telemetry: a header no one can store is dropped, not the start.
            trace_context={k: v for k, v in start.trace_context.items() if not unstorable({k: v})},
            request_hash=definition.fingerprint(value),
        )
        rt._take_input(started)
        return rt, rt._decision()

    @classmethod
    def replay(
        cls,
        definition: SagaDefinition,
        saga_id: str,
        history: list[Event],
        *,
        now: datetime | None = None,
    ) -> tuple[SagaRuntime, Decision]:
        """Rebuilds a saga from its history. The decision holds anything owed past the end.

        ``now`` is the runner's clock: a saga parked while it is rebuilt (the code
        deployed no longer matches its history) is parked at that time, never before its
        last event. Without it, at its last event's time (a replay check records nothing).
        """
        if not history or not isinstance(history[0], SagaStarted):
            raise SerializationError(f"saga {saga_id}: a history must begin with saga_started")
        rt = cls(definition, saga_id)
        rt._clock = history[-1].at if now is None else now
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

    @property
    def awaits_reply(self) -> bool:
        """A command it sent is not answered yet (``outstanding_commands`` is not empty)."""
        return any(f.held is None for f in self._inflight.values())

    def outstanding_commands(self) -> list[OutboundCommand]:
        """Commands sent but not answered: a recovering owner sends them again, same ids.
        (A step whose reply is held as invalid was answered: it is not sent again.)"""
        return [self._outbound(f.event) for f in self._inflight.values() if f.held is None]

    @property
    def started(self) -> SagaStarted:
        """The saga's first event: its input, key and request hash."""
        first = self._history[0]
        assert isinstance(first, SagaStarted)
        return first

    def held_steps(self) -> list[str]:
        """Steps whose success reply was held as invalid, waiting for an operator."""
        return sorted({f.event.step for f in self._inflight.values() if f.held is not None})

    def owed_compensations(self) -> list[str]:
        return [o.step for o in reversed(self._stack)]

    def handle(self, inbound: Inbound) -> Decision:
        """Applies one input and returns what to record and send.

        Raises InvalidTransition when the input makes no sense in the current status.
        """
        self._new = []
        self._clock = inbound.at
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
                f"{_input_name(inbound)} any more"
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
        """Releases the saga's code (its coroutines) without running any more of it.

        The runtime is unusable afterwards. Its cycles are broken here (runtime and
        context, tasks and the futures they wait on), so that an evicted saga is freed
        when its last reference goes rather than at the next full garbage collection,
        which a tuned service runs rarely: the engine's memory then follows its cache
        size, not the number of sagas it has evicted."""
        if self._loop.is_closed():
            return  # closed already (the batch path may drop a saga twice)
        self._closing = True
        self._loop.discard()
        self._signal_waiters.clear()
        self._resume_waiter = None
        self._lifecycle = None
        self._user_task = None
        self._ctx.detach()

    def parse(self, model: type[M], payload: JsonDict, what: str, step: str | None = None) -> M:
        try:
            return validate_payload(model, payload, what)
        except InvalidPayload as exc:
            exc.step = step  # the saga's error names the step whose reply it was
            raise

    def declared_signal(
        self, signal: Signal[Any] | str, model: type[BaseModel] | None
    ) -> Signal[Any]:
        """The saga's declaration of ``signal``; DefinitionError (raised in the saga's code)
        when it declares no such signal, or declares it with another model."""
        name = signal.name if isinstance(signal, Signal) else signal
        declared = self.definition.signals.get(name) if isinstance(name, str) else None
        cls_name = self.definition.cls.__name__
        if declared is None:
            hint = model.__name__ if model is not None else "MyPayload"
            self._definition_error(
                f"{cls_name} waits for signal {name!r} but does not declare it, so the engine "
                f"would refuse it; add `{name} = Signal({hint})` to the class, deploy, and "
                "resume the saga"
            )
        wanted = signal.model if isinstance(signal, Signal) else model
        if wanted is not None and wanted is not declared.model:
            self._definition_error(
                f"{cls_name} waits for signal {name!r} as {wanted.__name__}, but declares it "
                f"with {declared.model.__name__}; use the declared model, deploy, and resume"
            )
        return declared

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
                        f"saga {self.saga_id} still cannot be driven by the code deployed here "
                        f"({self._nd}); deploy code that replays its history, then resume"
                    )
                self._check_texts("resume", principal=inbound.principal, reason=inbound.reason)
                return SagaResumed(at=at, principal=inbound.principal, reason=inbound.reason)
            if isinstance(inbound, SignalInput | Cancel | ForceCompensate | Skip | RetryStep):
                raise InvalidTransition(
                    f"saga {self.saga_id} is parked as nondeterministic; resume it after "
                    f"deploying a fix before sending it a {_input_name(inbound)}"
                )
            return DropReason.PARKED
        if isinstance(inbound, Reply):
            inflight = self._inflight.get(inbound.command_id)
            if inflight is None:
                if inbound.command_id in self._issued_ids:
                    return DropReason.DUPLICATE_REPLY
                return DropReason.UNKNOWN_COMMAND
            if inflight.held is not None:
                return DropReason.DUPLICATE_REPLY  # answered already; its reply is held
            return self._reply_event(inbound, inflight)
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
        if isinstance(inbound, SignalInput):
            if inbound.signal_id in self._seen_signals:
                return DropReason.DUPLICATE_SIGNAL
            # Checked before anything is recorded: a signal the saga does not declare, or
            # a payload its model refuses, would only fail the saga's code later.
            self.definition.signal(inbound.name).validate(inbound.payload, "payload")
            self._check_texts(
                "signal", signal_id=inbound.signal_id, principal=inbound.principal,
                reason=inbound.reason,
            )  # fmt: skip
            return SignalReceived(
                at=at,
                signal_id=inbound.signal_id,
                name=inbound.name,
                payload=inbound.payload,
                principal=inbound.principal,
                reason=inbound.reason,
            )
        if isinstance(inbound, Cancel):
            if not self._forward or self._cancel_reason is not None:
                raise InvalidTransition(
                    f"saga {self.saga_id} is {self._status.value}: it is already undoing its "
                    "steps, so there is nothing to cancel"
                )
            self._check_texts("cancel", reason=inbound.reason, principal=inbound.principal)
            return CancelRequested(at=at, reason=inbound.reason, principal=inbound.principal)
        if isinstance(inbound, ForceCompensate):
            if not self._forward or self._cancel_reason is not None:
                raise InvalidTransition(
                    f"saga {self.saga_id} is {self._status.value}: it is already undoing its "
                    "steps, so there is nothing to force"
                )
            self._check_texts(
                "force-compensate", reason=inbound.reason, principal=inbound.principal
            )
            return CompensationForced(at=at, reason=inbound.reason, principal=inbound.principal)
        if isinstance(inbound, Skip):
            return self._skip_event(inbound)
        if isinstance(inbound, RetryStep):
            return self._retry_event(inbound)
        if isinstance(inbound, Resume):
            if self._status == SagaStatus.STEP_STUCK:
                raise InvalidTransition(
                    f"saga {self.saga_id} is step_stuck: the reply of step(s) "
                    f"{', '.join(map(repr, self.held_steps()))} did not match; retry the step "
                    "(its reply is checked again against the code deployed now) or skip it "
                    "with a valid result"
                )
            self._check_texts("resume", principal=inbound.principal, reason=inbound.reason)
            if self._status != SagaStatus.COMPENSATION_STUCK:
                raise InvalidTransition(
                    f"saga {self.saga_id} is {self._status.value}; only a saga whose "
                    "compensation is stuck (or that is parked as nondeterministic) can be resumed"
                )
            return SagaResumed(at=at, principal=inbound.principal, reason=inbound.reason)
        raise TypeError(f"unknown input {inbound!r}")

    def _in_flight(self) -> list[str]:
        return sorted({f.event.step for f in self._inflight.values()})

    @property
    def _forward(self) -> bool:
        """Still going forward: running, or running with a step held for an operator."""
        return self._status in (SagaStatus.RUNNING, SagaStatus.STEP_STUCK)

    def _check_texts(self, what: str, **texts: str | None) -> None:
        """An input's texts (reason, principal, ids) must be storable too."""
        check_storable(texts, what)

    def _reply_event(self, inbound: Reply, inflight: _InFlight) -> Event:
        """A reply as its event: accepted, or held as invalid (a success reply whose
        payload its step's model refuses, or that Postgres cannot store)."""
        compensation = isinstance(inflight.event, CompensationIssued)
        step = inflight.event.step
        error = storable_copy(inbound.error) if inbound.error is not None else None
        if compensation or inbound.outcome != "success":
            # A refusal's details and error text are kept for the record; what Postgres
            # cannot store is written out as escapes rather than losing the reply.
            return ReplyReceived(
                at=inbound.at, step=step, command_id=inbound.command_id,
                outcome=inbound.outcome, compensation=compensation,
                payload=storable_copy(inbound.payload), error=error,
            )  # fmt: skip
        what = f"the reply of step {step!r}"
        try:
            check_storable(inbound.payload, what, "payload")
            if inflight.returns is not None:
                validate_payload(inflight.returns, inbound.payload, what, "payload")
        except InvalidPayload as invalid:
            return InvalidReplyReceived(
                at=inbound.at,
                step=step,
                command_id=inbound.command_id,
                payload=storable_copy(inbound.payload),
                unstorable=isinstance(invalid, UnstorableValue),
                error=ErrorInfo(
                    type="InvalidReply",
                    message=f"{invalid}; the reply is held and the step waits: retry it "
                    "after a fix, or skip it with a valid result",
                    step=step,
                    details={"errors": invalid.errors},
                ),
            )
        return ReplyReceived(
            at=inbound.at, step=step, command_id=inbound.command_id, outcome="success",
            payload=inbound.payload, error=error,
        )  # fmt: skip

    def _waiting_forward(self, step: str) -> _InFlight | None:
        return next(
            (
                f
                for f in self._inflight.values()
                if f.event.step == step and isinstance(f.event, CommandIssued)
            ),
            None,
        )

    def _skip_event(self, inbound: Skip) -> Event:
        self._check_texts(
            "skip", step=inbound.step, principal=inbound.principal, reason=inbound.reason
        )
        what = f"the result for step {inbound.step!r}"
        check_storable(inbound.payload, what, "result")
        if self._status == SagaStatus.COMPENSATION_STUCK and self._stuck_step == inbound.step:
            return StepSkipped(
                at=inbound.at, step=inbound.step, compensation=True, payload=inbound.payload,
                principal=inbound.principal, reason=inbound.reason,
            )  # fmt: skip
        forward = self._waiting_forward(inbound.step)
        if self._forward and forward is not None and self._cancel_reason is None:
            # The result stands in for the participant's reply: it must be what the
            # step's code would accept from the participant.
            if forward.returns is not None:
                validate_payload(forward.returns, inbound.payload, what, "result")
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
        self._check_texts(
            "retry", step=inbound.step, principal=inbound.principal, reason=inbound.reason
        )
        held = self._waiting_forward(inbound.step)
        if held is not None and held.held is not None and self._cancel_reason is None:
            problem = self._held_problem(held)
            if problem is not None:
                raise InvalidTransition(problem)
            return RetryRequested(
                at=inbound.at, step=inbound.step, principal=inbound.principal,
                reason=inbound.reason,
            )  # fmt: skip
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

    def _held_problem(self, inflight: _InFlight) -> str | None:
        """Why a held reply still cannot be accepted by the code deployed now, or None."""
        held = inflight.held
        assert held is not None
        step = held.step
        if held.unstorable:
            return (
                f"the reply of step {step!r} held a value Postgres cannot store, so it cannot "
                "be accepted as it came; skip the step with a corrected result"
            )
        if inflight.returns is None:
            return None
        try:
            validate_payload(
                inflight.returns, held.payload, f"the held reply of step {step!r} still", "payload"
            )
        except InvalidPayload as exc:
            return (
                f"{exc} (with the code deployed here); deploy a fix first, or skip the step "
                "with a valid result"
            )
        return None

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
        self._settle_held()

    def _apply(self, event: Event) -> None:
        if isinstance(event, SagaStarted):
            self.trace_context = dict(event.trace_context)
            if event.deadline_at is not None:
                self._timers[DEADLINE_TIMER] = _Timer(fire_at=event.deadline_at)
            self._lifecycle = self._loop.create_task(self._run_lifecycle(event))
        elif isinstance(event, ReplyReceived | AttemptTimedOut | InvalidReplyReceived):
            inflight = self._inflight.get(event.command_id)
            if inflight is None or inflight.future.done():
                self._nondeterministic(
                    self._cursor - 1,
                    event.describe(),
                    f"no command {event.command_id} waiting ({self._describe_waiting()})",
                )
                raise _Halt
            if isinstance(event, InvalidReplyReceived):
                # The step keeps waiting, for an operator now: its attempt no longer times
                # out (the participant did answer), and nothing re-sends it.
                inflight.held = event
                self._timers.pop(timeout_timer_id(event.command_id, inflight.event.attempt), None)
            else:
                inflight.future.set_result(event if isinstance(event, ReplyReceived) else None)
        elif isinstance(event, TimerFired):
            timer = self._timers.pop(event.timer_id, None)
            if event.timer_id == DEADLINE_TIMER:
                self._request_cancel("deadline", "the saga's deadline passed")
            elif timer is not None and timer.future is not None and not timer.future.done():
                timer.future.set_result(None)
        elif isinstance(event, SignalReceived):
            self._seen_signals = _with(self._seen_signals, event.signal_id)
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
            held = self._waiting_forward(event.step)
            if held is not None and held.held is not None:
                # Checked again against the code running now (live it passed, or it would
                # not have been recorded): a retry recorded under a fixed deploy does not
                # replay under the broken one, and says so.
                problem = self._held_problem(held)
                if problem is not None:
                    self._nondeterministic(
                        self._cursor - 1, f"{event.describe()}, accepting its held reply", problem
                    )
                    raise _Halt
                self._release(held, held.held.payload, skipped=False)
            elif self._stuck_step == event.step and self._resume_waiter is not None:
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
                # A step the participant never answered was done by hand: not compensated
                # later. One whose reply was held did reach the participant, which applied
                # it: its compensation stays owed.
                self._release(inflight, event.payload, skipped=inflight.held is None)
                return

    def _release(self, inflight: _InFlight, payload: JsonDict, *, skipped: bool) -> None:
        """Answers a waiting forward step with ``payload`` (an operator's skip, or a held
        reply accepted on retry); the saga goes back to running once nothing is held."""
        if skipped:
            self._skipped_ids = _with(self._skipped_ids, inflight.event.command_id)
        inflight.held = None
        inflight.future.set_result(
            ReplyReceived(
                at=self.now,
                step=inflight.event.step,
                command_id=inflight.event.command_id,
                outcome="success",
                payload=payload,
            )
        )
        self._settle_held()

    def _settle_held(self) -> None:
        """step_stuck lasts while a reply is held: when none is (released by an operator,
        or its step ended another way), the saga is running again."""
        if self._status != SagaStatus.STEP_STUCK or self._nd is not None:
            return
        held = [f.held for f in self._inflight.values() if f.held is not None]
        if held:
            self._error = held[0].error
            return
        self._status = check_transition(self._status, SagaStatus.RUNNING)
        if self._error is not None and self._error.type == "InvalidReply":
            self._error = None

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
        elif isinstance(event, InvalidReplyReceived):
            new = SagaStatus.STEP_STUCK
            self._error = event.error
        elif (
            isinstance(event, StepSkipped | RetryRequested)
            and self._status == SagaStatus.COMPENSATION_STUCK
            and self._stuck_step == event.step
        ):
            new = SagaStatus.COMPENSATING  # the operator unblocked the stuck compensation
            self._error = self._compensation_cause()  # no longer stuck
        elif isinstance(event, SagaResumed):
            # One resume clears a nondeterminism park and retries a stuck compensation
            # (the lifecycle's waiter is woken by the same event in _apply).
            self._parked = False
            if self._status == SagaStatus.COMPENSATION_STUCK:
                new = SagaStatus.COMPENSATING
            # What parked it is over: the saga reports the error of where it goes back
            # to (a held reply's is set again by _settle_held), until a new one.
            self._error = self._compensation_cause() if new == SagaStatus.COMPENSATING else None
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
            self._issued_ids = _with(self._issued_ids, event.command_id)
        self._status = check_transition(self._status, new)

    def _compensation_cause(self) -> ErrorInfo | None:
        """Why the saga compensates: the error its compensation_started recorded (a saga
        starts compensating once)."""
        started = next(
            (e for e in reversed(self._history) if isinstance(e, CompensationStarted)), None
        )
        return started.error if started is not None else None

    def _nondeterministic(self, index: int | None, expected: str, actual: str) -> None:
        seq = index + 1 if index is not None and index < len(self._history) else None
        nd = NondeterminismError(self.saga_id, seq, expected, actual)
        self._park(
            nd,
            "nondeterministic",
            ErrorInfo(
                type="NondeterminismError",
                message=str(nd),
                details={"seq": seq, "expected": expected, "actual": actual},
            ),
        )

    def _definition_error(self, message: str) -> NoReturn:
        error = DefinitionError(message)
        self._park(
            error,
            "definition_error",
            ErrorInfo(type="DefinitionError", message=message, step=self._current_step),
        )
        raise _Halt

    def _park(
        self,
        cause: PermanentError,
        reason: Literal["nondeterministic", "definition_error"],
        error: ErrorInfo,
    ) -> None:
        """Stops the code where it stands: the code deployed cannot drive this saga."""
        self._nd = cause
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
            # When the runner parks it (live: the input's time; rebuilt: the runner's
            # clock, not the replayed time), and never before the history it ends.
            at=max(self._clock, self._history[-1].at),
            reason=reason,
            error=error,
        )
        # The code is abandoned where it stands; the recorded history stays as it was
        # and the marker goes at its end.
        self._history.append(parked)
        self._new.append(parked)
        self._error = parked.error

    def _describe_waiting(self) -> str:
        waits = [
            f"a reply to step {f.event.step!r}"
            if f.held is None
            else f"an operator for step {f.event.step!r} (its reply is held)"
            for f in self._inflight.values()
        ]
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

"""The saga's operations and lifecycle, as they run on the deterministic loop.

``SagaOperations`` holds what ``ctx`` does (steps, timers, signals, side effects,
patches) and the lifecycle around the user's ``run``: finishing, failing and
compensating. ``SagaRuntime`` (in ``_runtime``) adds the input side: replay,
delivery of inputs and status tracking.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import itertools
import random
import uuid
from collections import deque
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, NoReturn, TypeVar

from pydantic import BaseModel, ValidationError

from saga_engine._context import SagaContext
from saga_engine._decision import DEADLINE_TIMER, command_id_for
from saga_engine._definition import SagaDefinition
from saga_engine._errors import (
    DefinitionError,
    InvalidPayload,
    PermanentError,
    SagaError,
    SerializationError,
    SignalTimeout,
    StepFailed,
    StepTimedOut,
)
from saga_engine._events import (
    CommandIssued,
    CompensationCompleted,
    CompensationIssued,
    CompensationSpec,
    CompensationStarted,
    CompensationStuck,
    ErrorInfo,
    Event,
    InvalidReplyReceived,
    PatchMarked,
    ReplyReceived,
    SagaCancelled,
    SagaCompensated,
    SagaCompleted,
    SagaFailed,
    SagaStarted,
    SideEffectRecorded,
    TimerStarted,
)
from saga_engine._loop import DeterministicLoop
from saga_engine._policy import (
    DEFAULT_COMPENSATION_RETRY,
    DEFAULT_COMPENSATION_TIMEOUT,
    DEFAULT_STEP_RETRY,
    RetryPolicy,
)
from saga_engine._serde import (
    JsonDict,
    canonical_hash,
    check_storable,
    dumps,
    model_payload,
    type_name,
)
from saga_engine._status import SagaStatus

E = TypeVar("E", bound=Event)
T = TypeVar("T")


# --------------------------------------------------------------------------- internals


class _Halt(BaseException):
    """Unwinds saga code after nondeterminism; a BaseException so `except Exception` won't eat it."""


@dataclass(slots=True)
class _InFlight:
    event: CommandIssued | CompensationIssued
    future: asyncio.Future[ReplyReceived | None]  # None: the attempt timed out
    #: The step's reply model (``returns=``): a success reply must match it.
    returns: type[BaseModel] | None = None
    #: A success reply that did not match (or could not be stored): the step waits for
    #: an operator's retry or skip, and the saga is step_stuck while any is held.
    held: InvalidReplyReceived | None = None


def timeout_timer_id(command_id: str, attempt: int) -> str:
    return f"timeout:{command_id}:{attempt}"


@dataclass(slots=True)
class _Timer:
    fire_at: datetime
    future: asyncio.Future[None] | None = None
    command_id: str | None = None


@dataclass(frozen=True, slots=True)
class _Owed:
    step: str
    spec: CompensationSpec
    #: The forward command ids the step issued: the compensation names them, so a
    #: participant can refuse a forward command that arrives after its compensation.
    forward_ids: tuple[str, ...] = ()


def error_info(exc: BaseException, step: str | None = None) -> ErrorInfo:
    if isinstance(exc, StepFailed):
        return ErrorInfo(
            type=type(exc).__name__, message=str(exc), step=exc.step, details=exc.details
        )
    if isinstance(exc, InvalidPayload):
        # It names its own step (a step's reply), or none (a signal's payload): the
        # step the saga last ran has nothing to do with it.
        return ErrorInfo(
            type=type(exc).__name__,
            message=str(exc),
            step=exc.step,
            details={"errors": exc.errors},
        )
    return ErrorInfo(type=type(exc).__name__, message=str(exc) or type(exc).__name__, step=step)


#: The empty value of the id sets of a runtime until their first id: four empty sets are most
#: of a kilobyte per saga in memory, and many sagas never fill some of them.
_NO_IDS: frozenset[str] = frozenset()


def _with(ids: AbstractSet[str], value: str) -> set[str]:
    """``ids`` with ``value`` added: the set itself, or a new one in place of _NO_IDS."""
    out = ids if isinstance(ids, set) else set(ids)
    out.add(value)
    return out


class SagaOperations:
    """State and operations shared by the runtime; see ``SagaRuntime`` for the rest."""

    # Slots, not an instance dict: an engine holds up to engine.cache_size of these, and
    # a dict of three dozen attributes is a kilobyte and a half of each.
    __slots__ = (
        "_cancel_message", "_cancel_reason", "_clock", "_closing", "_counters", "_ctx",
        "_current_step", "_cursor", "_error", "_history", "_inflight", "_issued_ids",
        "_last_attempt", "_lifecycle", "_loop", "_nd", "_new", "_parked", "_patches",
        "_resume_waiter", "_rng_state", "_seen_signals", "_signal_waiters", "_signals",
        "_skipped_ids", "_stack", "_status", "_step_names", "_stuck_step", "_timers",
        "_user_task", "definition", "now", "output", "saga_id", "saga_type",
        "trace_context",
    )  # fmt: skip

    definition: SagaDefinition
    saga_id: str
    saga_type: str
    now: datetime
    _clock: datetime
    _loop: DeterministicLoop
    _ctx: SagaContext
    _history: list[Event]
    _cursor: int
    _new: list[Event]
    _status: SagaStatus
    _current_step: str | None
    _nd: PermanentError | None
    _inflight: dict[str, _InFlight]
    _timers: dict[str, _Timer]
    _signals: dict[str, deque[JsonDict]]
    _signal_waiters: dict[str, asyncio.Future[JsonDict | None]]
    _stack: list[_Owed]
    _step_names: AbstractSet[str]
    _counters: dict[str, itertools.count[int]]
    _patches: dict[str, bool]
    _rng_state: random.Random | None
    _lifecycle: asyncio.Task[None] | None
    _user_task: asyncio.Task[Any] | None
    _cancel_reason: Literal["cancel", "deadline", "forced"] | None
    _cancel_message: str
    _closing: bool
    _resume_waiter: asyncio.Future[str] | None
    _stuck_step: str | None
    _skipped_ids: AbstractSet[str]

    def _track(self, event: Event) -> None:
        raise NotImplementedError

    def _nondeterministic(self, index: int | None, expected: str, actual: str) -> None:
        raise NotImplementedError

    def _definition_error(self, message: str) -> NoReturn:
        """The saga's code cannot run as written. A bug in the code is not a reason to
        undo a business transaction: the saga is parked (like a nondeterministic one) for
        a fixed deploy and a resume, and the code is unwound without compensating."""
        raise NotImplementedError

    # ------------------------------------------------------------------ intents

    def _emit(self, event: E) -> E:
        """Records an intent, or on replay matches it against the recorded one."""
        if self._nd is not None:
            raise _Halt
        if self._cursor < len(self._history):
            recorded = self._history[self._cursor]
            if recorded.is_intent and recorded.signature() == event.signature():
                self._cursor += 1
                self._track(recorded)
                return recorded  # type: ignore[return-value]
            self._nondeterministic(self._cursor, recorded.describe(), event.describe())
            raise _Halt
        self._history.append(event)
        self._new.append(event)
        self._cursor += 1
        self._track(event)
        return event

    def _next_id(self, kind: str) -> int:
        return next(self._counters.setdefault(kind, itertools.count(1)))

    def _check_open(self) -> None:
        if self._nd is not None:
            raise _Halt
        if self._closing or self._cancel_reason is not None:
            # The run is over (failed, cancelled or finished): no new operations.
            raise asyncio.CancelledError()

    async def _await_command(
        self, event: CommandIssued | CompensationIssued, returns: type[BaseModel] | None = None
    ) -> ReplyReceived | None:
        future: asyncio.Future[ReplyReceived | None] = self._loop.create_future()
        self._inflight[event.command_id] = _InFlight(event, future, returns)
        timer_id = timeout_timer_id(event.command_id, event.attempt)
        if event.timeout_at is not None:
            self._timers[timer_id] = _Timer(fire_at=event.timeout_at, command_id=event.command_id)
        try:
            return await future
        finally:
            self._inflight.pop(event.command_id, None)
            self._timers.pop(timer_id, None)

    async def _timer(
        self, timer_id: str, purpose: Literal["sleep", "retry"], delay: timedelta
    ) -> None:
        started = self._emit(
            TimerStarted(at=self.now, timer_id=timer_id, purpose=purpose, fire_at=self.now + delay)
        )
        future: asyncio.Future[None] = self._loop.create_future()
        self._timers[timer_id] = _Timer(fire_at=started.fire_at, future=future)
        try:
            await future
        finally:
            self._timers.pop(timer_id, None)

    async def op_step(
        self,
        name: str,
        *,
        to: str,
        command: BaseModel,
        compensate: BaseModel | None,
        retry: RetryPolicy | None,
        timeout: timedelta | None,
        compensate_retry: RetryPolicy | None,
        returns: type[BaseModel] | None = None,
    ) -> JsonDict:
        self._check_open()
        if not isinstance(name, str) or not name:
            self._definition_error("a step needs a non-empty string name")
        if name in self._step_names:
            self._definition_error(
                f"step name {name!r} is used twice in one run of saga {self.saga_type!r}; each "
                f'step needs a stable, unique name (in a loop, use e.g. f"{name}-{{i}}")'
            )
        for what, value in (("command", command), ("compensate", compensate)):
            if value is not None and not isinstance(value, BaseModel):
                self._definition_error(
                    f"step {name!r}: {what} must be a pydantic model, got {value!r}"
                )
        if returns is not None and not (
            isinstance(returns, type) and issubclass(returns, BaseModel)
        ):
            self._definition_error(f"step {name!r}: returns must be a pydantic model class")
        self._step_names = _with(self._step_names, name)
        policy = retry or DEFAULT_STEP_RETRY
        payload = model_payload(command)
        # Refused here, in the saga's code, rather than by Postgres when the command is
        # appended (which would lose the input being handled). A replayed command was
        # stored, so it is storable: no need to look again.
        live = self._cursor >= len(self._history)
        if live:
            check_storable(payload, f"the command of step {name!r}")
        spec = None
        if compensate is not None:
            compensation_payload = model_payload(compensate)
            if live:
                check_storable(compensation_payload, f"the compensation of step {name!r}")
            spec = CompensationSpec(
                participant=to,
                command_type=type_name(compensate),
                payload=compensation_payload,
                retry=compensate_retry or DEFAULT_COMPENSATION_RETRY,
                timeout_s=(timeout or DEFAULT_COMPENSATION_TIMEOUT).total_seconds(),
            )
        generation, unknown, last_error = 0, False, ""
        sent: list[str] = []
        for attempt in itertools.count(1):
            issued = self._emit(
                CommandIssued(
                    at=self.now,
                    step=name,
                    participant=to,
                    command_type=type_name(command),
                    payload=payload,
                    payload_hash=canonical_hash(payload),
                    command_id=command_id_for(self.saga_id, name, generation, compensation=False),
                    attempt=attempt,
                    timeout_at=self.now + timeout if timeout else None,
                    compensation=spec,
                )
            )
            if issued.command_id not in sent:
                sent.append(issued.command_id)
            try:
                reply = await self._await_command(issued, returns)
            except asyncio.CancelledError:
                # Cancelled in flight: it may or may not have been applied.
                if spec is not None:
                    self._stack.append(_Owed(name, spec, tuple(sent)))
                raise
            if reply is None:
                unknown, last_error = True, "timed out"
            elif reply.outcome == "success":
                if issued.command_id in self._skipped_ids:
                    return reply.payload  # answered by an operator: not compensated later
                if spec is not None:
                    self._stack.append(_Owed(name, spec, tuple(sent)))
                return reply.payload
            elif reply.outcome == "failure":
                raise StepFailed(
                    name, reply.error or "refused by participant", details=reply.payload
                )
            else:  # retryable: the participant says nothing was applied
                generation, unknown, last_error = generation + 1, False, reply.error or "retryable"
            if attempt >= policy.max_attempts:
                if unknown:
                    if spec is not None:
                        self._stack.append(_Owed(name, spec, tuple(sent)))
                    raise StepTimedOut(name, attempt)
                raise StepFailed(name, f"gave up after {attempt} attempts: {last_error}")
            try:
                self._check_open()
                delay = policy.backoff(attempt, seed=f"{self.saga_id}:{name}")
                await self._timer(f"retry:{name}:{attempt}", "retry", delay)
            except asyncio.CancelledError:
                # Stopped while waiting to retry after a timeout: the last attempt may
                # have been applied, so its compensation is owed.
                if unknown and spec is not None:
                    self._stack.append(_Owed(name, spec, tuple(sent)))
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def op_sleep(self, delay: timedelta) -> None:
        self._check_open()
        await self._timer(f"sleep:{self._next_id('sleep')}", "sleep", delay)

    async def op_wait_signal(self, name: str, timeout: timedelta | None) -> JsonDict:
        self._check_open()
        buffered = self._signals.get(name)
        if buffered:
            return buffered.popleft()
        if name in self._signal_waiters:
            self._definition_error(
                f"two waits for signal {name!r} at once; wait for it in one place"
            )
        future: asyncio.Future[JsonDict | None] = self._loop.create_future()
        self._signal_waiters[name] = future
        timer_id = None
        if timeout is not None:
            timer_id = f"signal:{name}:{self._next_id('signal:' + name)}"
            started = self._emit(
                TimerStarted(
                    at=self.now,
                    timer_id=timer_id,
                    purpose="signal_timeout",
                    fire_at=self.now + timeout,
                )
            )
            timer_future: asyncio.Future[None] = self._loop.create_future()
            timer_future.add_done_callback(
                lambda _: future.done() or future.set_result(None)  # type: ignore[func-returns-value]
            )
            self._timers[timer_id] = _Timer(fire_at=started.fire_at, future=timer_future)
        try:
            payload = await future
        finally:
            self._signal_waiters.pop(name, None)
            if timer_id is not None:
                self._timers.pop(timer_id, None)
        if payload is None:
            raise SignalTimeout(name)
        return payload

    async def op_side_effect(self, fn: Callable[[], T]) -> T:
        self._check_open()
        op_id = f"side_effect:{self._next_id('side_effect')}"
        if self._cursor < len(self._history):
            recorded = self._history[self._cursor]
            if isinstance(recorded, SideEffectRecorded) and recorded.op_id == op_id:
                self._cursor += 1
                return recorded.value  # type: ignore[no-any-return]
            self._nondeterministic(self._cursor, recorded.describe(), f"side effect {op_id!r}")
            raise _Halt
        value: Any = fn()
        if inspect.isawaitable(value):
            if inspect.iscoroutine(value):
                value.close()  # never awaited, on purpose
            self._definition_error(
                "ctx.side_effect takes a plain function; do I/O in a step instead of awaiting here"
            )
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        dumps(value)  # must be JSON, or SerializationError now rather than at append time
        check_storable(value, f"the value of {op_id}")
        self._emit(SideEffectRecorded(at=self.now, op_id=op_id, value=value))
        return value  # type: ignore[no-any-return]

    def op_patched(self, patch_id: str) -> bool:
        if patch_id in self._patches:
            return self._patches[patch_id]
        if self._nd is not None:
            raise _Halt
        if self._cursor < len(self._history):
            recorded = self._history[self._cursor]
            found = isinstance(recorded, PatchMarked) and recorded.patch_id == patch_id
            if found:
                self._cursor += 1
        else:
            self._emit(PatchMarked(at=self.now, patch_id=patch_id))
            found = True
        self._patches[patch_id] = found
        return found

    @property
    def _rng(self) -> random.Random:
        # Seeded from the saga id on first use: most sagas never ask for randomness, and
        # seeding costs more than the rest of a reply's bookkeeping.
        if self._rng_state is None:
            self._rng_state = random.Random(hashlib.sha256(self.saga_id.encode()).digest())
        return self._rng_state

    def deterministic_uuid(self) -> uuid.UUID:
        return uuid.UUID(int=self._rng.getrandbits(128), version=4)

    def deterministic_random(self) -> float:
        return self._rng.random()

    # ------------------------------------------------------------------ lifecycle

    async def _run_user(self, started: SagaStarted) -> Any:
        saga = self.definition.cls()
        value = self.definition.input_type.model_validate(started.input)
        return await saga.run(self._ctx, value)

    async def _finish_stragglers(self) -> None:
        """Stops the run's other tasks (a gather's siblings still in flight)."""
        self._closing = True
        self._timers.pop(DEADLINE_TIMER, None)  # the run is over; the deadline no longer applies
        pending = [t for t in self._loop.tasks if t is not self._lifecycle and not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _run_lifecycle(self, started: SagaStarted) -> None:
        self._user_task = self._loop.create_task(self._run_user(started))
        error: ErrorInfo | None = None
        try:
            result = await self._user_task
        except asyncio.CancelledError:
            pass
        except (_Halt, GeneratorExit):
            raise  # nondeterminism, or the runtime is being discarded: no more code runs
        except DefinitionError as exc:
            # The code misused the engine somewhere ctx could not catch it (the asyncio
            # clock, say): parked like the rest, not compensated.
            self._definition_error(str(exc))
        except BaseException as exc:  # the run failed: compensate
            error = error_info(exc, None if isinstance(exc, SignalTimeout) else self._current_step)
        else:
            if self._cancel_reason is None:
                try:
                    output = self._serialize_output(result)
                except SagaError as exc:
                    error = error_info(exc)
                else:
                    await self._finish_stragglers()
                    self._emit(SagaCompleted(at=self.now, output=output))
                    return
        await self._finish_stragglers()
        reason: Literal["failure", "cancel", "deadline", "operator"] = (
            "operator" if self._cancel_reason == "forced" else self._cancel_reason or "failure"
        )
        if self._cancel_reason == "forced":
            error = ErrorInfo(type="OperatorForcedCompensation", message=self._cancel_message)
        elif self._cancel_reason == "deadline":
            error = ErrorInfo(type="DeadlineExceeded", message=self._cancel_message)
        elif self._cancel_reason == "cancel":
            error = ErrorInfo(type="SagaCancelled", message=self._cancel_message)
        assert error is not None
        owed = list(reversed(self._stack))
        if owed:
            self._emit(
                CompensationStarted(
                    at=self.now, reason=reason, error=error, owed=[o.step for o in owed]
                )
            )
            for entry in owed:
                await self._compensate(entry)
        if reason == "cancel":
            self._emit(SagaCancelled(at=self.now, reason=self._cancel_message))
        elif owed:
            self._emit(SagaCompensated(at=self.now, error=error))
        else:
            self._emit(SagaFailed(at=self.now, error=error))

    def _serialize_output(self, result: Any) -> JsonDict:
        model = self.definition.output_type
        if not isinstance(result, model):
            try:
                result = model.model_validate(result)
            except ValidationError as exc:
                raise SerializationError(
                    f"{self.definition.cls.__name__}.run returned {type(result).__name__}, "
                    f"expected {model.__name__}: {exc}"
                ) from exc
        output = model_payload(result)
        check_storable(output, f"the output of {self.definition.cls.__name__}.run")
        return output

    async def _compensate(self, owed: _Owed) -> None:
        spec = owed.spec
        timeout = timedelta(seconds=spec.timeout_s) if spec.timeout_s else None
        generation, round_attempts = 0, 0
        for attempt in itertools.count(1):
            round_attempts += 1
            issued = self._emit(
                CompensationIssued(
                    at=self.now,
                    step=owed.step,
                    participant=spec.participant,
                    command_type=spec.command_type,
                    payload=spec.payload,
                    payload_hash=canonical_hash(spec.payload),
                    command_id=command_id_for(
                        self.saga_id, owed.step, generation, compensation=True
                    ),
                    attempt=attempt,
                    timeout_at=self.now + timeout if timeout else None,
                    compensates=list(owed.forward_ids),
                )
            )
            reply = await self._await_command(issued)
            if reply is not None and reply.outcome == "success":
                self._emit(CompensationCompleted(at=self.now, step=owed.step))
                self._stack.remove(owed)  # no longer owed
                return
            if reply is None:
                last_error = "timed out"
            else:
                # A refused compensation is retried under a new id: the participant stored
                # its refusal under the old one and would only repeat it.
                generation += 1
                last_error = reply.error or reply.outcome
            if round_attempts >= spec.retry.max_attempts:
                self._emit(
                    CompensationStuck(
                        at=self.now,
                        step=owed.step,
                        error=ErrorInfo(
                            type="CompensationStuck",
                            message=f"compensation of {owed.step!r} still failing after "
                            f"{round_attempts} attempts: {last_error}",
                            step=owed.step,
                        ),
                    )
                )
                self._resume_waiter = self._loop.create_future()
                self._stuck_step = owed.step
                action = await self._resume_waiter
                self._resume_waiter, self._stuck_step = None, None
                if action == "skip":
                    # An operator compensated it by hand (recorded as step_skipped).
                    self._stack.remove(owed)
                    return
                round_attempts = 0
                continue
            delay = spec.retry.backoff(attempt, seed=f"{self.saga_id}:compensate:{owed.step}")
            await self._timer(f"retry:compensate:{owed.step}:{attempt}", "retry", delay)

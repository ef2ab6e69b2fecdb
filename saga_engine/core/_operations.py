"""The saga's operations and lifecycle, as they run on the deterministic loop.

Functions over one :class:`~saga_engine.core._state.SagaState`: what ``ctx`` does (steps,
timers, signals, side effects, patches; :class:`~saga_engine.core._runtime.SagaRuntime`
passes the context's calls here), and the lifecycle around the user's ``run``:
finishing, failing and compensating.

The compensation stack lives here, whole: when a step's compensation becomes owed
(:func:`step`, and :func:`release` for a step an operator answered), how the owed
compensations run, last in first out, each under its own retry policy
(:func:`run_lifecycle`), and how a stuck one waits for an operator
(:func:`unblock_compensation`).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import itertools
import random
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from saga_engine.core._decision import (
    CHILD_PARTICIPANT,
    CHILD_STEP_PREFIX,
    DEADLINE_TIMER,
    ChildStart,
    ChildUndo,
    child_saga_id,
    command_id_for,
)
from saga_engine.core._definition import Saga, Signal
from saga_engine.core._events import (
    CommandIssued,
    CompensationCompleted,
    CompensationIssued,
    CompensationSpec,
    CompensationStarted,
    CompensationStuck,
    ErrorInfo,
    Event,
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
from saga_engine.core._policy import (
    DEFAULT_COMPENSATION_RETRY,
    DEFAULT_COMPENSATION_TIMEOUT,
    DEFAULT_STEP_RETRY,
    RetryPolicy,
)
from saga_engine.core._state import (
    Halt,
    InFlight,
    OwedCompensation,
    PendingTimer,
    SagaState,
    timeout_timer_id,
    with_id,
)
from saga_engine.core._status import SagaStatus
from saga_engine.kernel._errors import (
    DefinitionError,
    InvalidPayload,
    SagaError,
    SerializationError,
    SignalTimeout,
    StepFailed,
    StepTimedOut,
)
from saga_engine.kernel._serde import (
    JsonDict,
    canonical_hash,
    check_storable,
    dumps,
    model_payload,
    type_name,
    validate_payload,
)

E = TypeVar("E", bound=Event)
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


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


# --------------------------------------------------------------------------- intents


def _emit(s: SagaState, event: E) -> E:
    """Records an intent, or on replay matches it against the recorded one."""
    if s.nondeterminism is not None:
        raise Halt
    if s.cursor < len(s.history):
        recorded = s.history[s.cursor]
        if recorded.is_intent and recorded.signature() == event.signature():
            s.cursor += 1
            s.track(recorded)
            return recorded  # type: ignore[return-value]
        s.nondeterministic(s.cursor, recorded.describe(), event.describe())
        raise Halt
    s.history.append(event)
    s.new.append(event)
    s.cursor += 1
    s.track(event)
    return event


def _next_id(s: SagaState, kind: str) -> int:
    return next(s.counters.setdefault(kind, itertools.count(1)))


def _check_open(s: SagaState) -> None:
    if s.nondeterminism is not None:
        raise Halt
    if s.closing or s.cancel_reason is not None:
        # The run is over (failed, cancelled or finished): no new operations.
        raise asyncio.CancelledError()


async def _await_command(
    s: SagaState, event: CommandIssued | CompensationIssued, returns: type[BaseModel] | None = None
) -> ReplyReceived | None:
    future: asyncio.Future[ReplyReceived | None] = s.loop.create_future()
    s.inflight[event.command_id] = InFlight(event, future, returns)
    timer_id = timeout_timer_id(event.command_id, event.attempt)
    if event.timeout_at is not None:
        s.timers[timer_id] = PendingTimer(fire_at=event.timeout_at, command_id=event.command_id)
    try:
        return await future
    finally:
        s.inflight.pop(event.command_id, None)
        s.timers.pop(timer_id, None)


async def _timer(
    s: SagaState, timer_id: str, purpose: Literal["sleep", "retry"], delay: timedelta
) -> None:
    started = _emit(
        s, TimerStarted(at=s.now, timer_id=timer_id, purpose=purpose, fire_at=s.now + delay)
    )
    future: asyncio.Future[None] = s.loop.create_future()
    s.timers[timer_id] = PendingTimer(fire_at=started.fire_at, future=future)
    try:
        await future
    finally:
        s.timers.pop(timer_id, None)


# --------------------------------------------------------------------------- ctx's operations


async def step(
    s: SagaState,
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
    _check_open(s)
    if not isinstance(name, str) or not name:
        s.definition_error("a step needs a non-empty string name")
    if name in s.step_names:
        s.definition_error(
            f"step name {name!r} is used twice in one run of saga {s.saga_type!r}; each "
            f'step needs a stable, unique name (in a loop, use e.g. f"{name}-{{i}}")'
        )
    for what, value in (("command", command), ("compensate", compensate)):
        if value is not None and not isinstance(value, BaseModel):
            s.definition_error(f"step {name!r}: {what} must be a pydantic model, got {value!r}")
    if returns is not None and not (isinstance(returns, type) and issubclass(returns, BaseModel)):
        s.definition_error(f"step {name!r}: returns must be a pydantic model class")
    s.step_names = with_id(s.step_names, name)
    policy = retry or DEFAULT_STEP_RETRY
    payload = model_payload(command)
    # Refused here, in the saga's code, rather than by Postgres when the command is
    # appended (which would lose the input being handled). A replayed command was
    # stored, so it is storable: no need to look again.
    live = s.cursor >= len(s.history)
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
        issued = _emit(
            s,
            CommandIssued(
                at=s.now,
                step=name,
                participant=to,
                command_type=type_name(command),
                payload=payload,
                payload_hash=canonical_hash(payload),
                command_id=command_id_for(s.saga_id, name, generation, compensation=False),
                attempt=attempt,
                timeout_at=s.now + timeout if timeout else None,
                compensation=spec,
            ),
        )
        if issued.command_id not in sent:
            sent.append(issued.command_id)
        try:
            reply = await _await_command(s, issued, returns)
        except asyncio.CancelledError:
            # Cancelled in flight: it may or may not have been applied.
            _owe(s, name, spec, sent)
            raise
        if reply is None:
            unknown, last_error = True, "timed out"
        elif reply.outcome == "success":
            if issued.command_id not in s.skipped_ids:  # (see release)
                _owe(s, name, spec, sent)
            return reply.payload
        elif reply.outcome == "failure":
            raise StepFailed(name, reply.error or "refused by participant", details=reply.payload)
        else:  # retryable: the participant says nothing was applied
            generation, unknown, last_error = generation + 1, False, reply.error or "retryable"
        if attempt >= policy.max_attempts:
            if unknown:
                _owe(s, name, spec, sent)
                raise StepTimedOut(name, attempt)
            raise StepFailed(name, f"gave up after {attempt} attempts: {last_error}")
        try:
            _check_open(s)
            delay = policy.backoff(attempt, seed=f"{s.saga_id}:{name}")
            await _timer(s, f"retry:{name}:{attempt}", "retry", delay)
        except asyncio.CancelledError:
            # Stopped while waiting to retry after a timeout: the last attempt may
            # have been applied, so its compensation is owed.
            if unknown:
                _owe(s, name, spec, sent)
            raise
    raise AssertionError("unreachable")  # pragma: no cover


#: A child is asked again (its start re-sent, same command id) this often by default: an
#: ended child answers a repeated start with its end. It covers the one window where an
#: end can be lost (its engine died after recording the end, before sending it).
DEFAULT_CHILD_POLL = timedelta(minutes=5)
#: Asking again is not a failure: a child is waited for 10,000 polls (34 days at the
#: default poll) before the step times out, one second apart.
CHILD_RETRY = RetryPolicy(
    max_attempts=10_000,
    initial_backoff=timedelta(seconds=1),
    max_backoff=timedelta(seconds=1),
    jitter=0.0,
)


async def child(
    s: SagaState,
    saga: type[Saga[Any, Any]],
    input: BaseModel | JsonDict,
    *,
    key: str | None,
    poll: timedelta | None,
    retry: RetryPolicy | None,
) -> JsonDict:
    """Starts a child saga and waits for its end: a step whose participant is the engine
    (see ``CHILD_PARTICIPANT``), so it is recorded, re-sent, compensated and cancelled
    like any step. Its id derives from this saga's id and ``key``."""
    _check_open(s)
    if not (isinstance(saga, type) and issubclass(saga, Saga)):
        s.definition_error(f"ctx.child needs a Saga class, got {saga!r}")
    name = key if key is not None else saga.name
    if not isinstance(name, str) or not name:
        s.definition_error("ctx.child needs a non-empty string id")
    child_id = child_saga_id(s.saga_id, name)
    started = s.history[0]
    assert isinstance(started, SagaStarted)
    raw = input.model_dump(mode="json", by_alias=True) if isinstance(input, BaseModel) else input
    value = validate_payload(saga.input_type, raw, f"the input of child saga {name!r}")
    return await step(
        s,
        f"{CHILD_STEP_PREFIX}{name}",
        to=CHILD_PARTICIPANT,
        command=ChildStart(
            saga_id=child_id,
            saga_type=saga.name,
            input=model_payload(value),
            priority=started.priority,
            fairness_key=started.fairness_key,
        ),
        compensate=ChildUndo(saga_id=child_id, saga_type=saga.name),
        retry=retry or CHILD_RETRY,
        timeout=poll,
        compensate_retry=None,
        returns=saga.output_type,
    )


async def sleep(s: SagaState, delay: timedelta) -> None:
    _check_open(s)
    await _timer(s, f"sleep:{_next_id(s, 'sleep')}", "sleep", delay)


async def wait_signal(s: SagaState, name: str, timeout: timedelta | None) -> JsonDict:
    _check_open(s)
    buffered = s.signals.get(name)
    if buffered:
        return buffered.popleft()
    if name in s.signal_waiters:
        s.definition_error(f"two waits for signal {name!r} at once; wait for it in one place")
    future: asyncio.Future[JsonDict | None] = s.loop.create_future()
    s.signal_waiters[name] = future
    timer_id = None
    if timeout is not None:
        timer_id = f"signal:{name}:{_next_id(s, 'signal:' + name)}"
        started = _emit(
            s,
            TimerStarted(
                at=s.now, timer_id=timer_id, purpose="signal_timeout", fire_at=s.now + timeout
            ),
        )
        timer_future: asyncio.Future[None] = s.loop.create_future()
        timer_future.add_done_callback(
            lambda _: future.done() or future.set_result(None)  # type: ignore[func-returns-value]
        )
        s.timers[timer_id] = PendingTimer(fire_at=started.fire_at, future=timer_future)
    try:
        payload = await future
    finally:
        s.signal_waiters.pop(name, None)
        if timer_id is not None:
            s.timers.pop(timer_id, None)
    if payload is None:
        raise SignalTimeout(name)
    return payload


async def side_effect(s: SagaState, fn: Callable[[], T]) -> T:
    _check_open(s)
    op_id = f"side_effect:{_next_id(s, 'side_effect')}"
    if s.cursor < len(s.history):
        recorded = s.history[s.cursor]
        if isinstance(recorded, SideEffectRecorded) and recorded.op_id == op_id:
            s.cursor += 1
            return recorded.value  # type: ignore[no-any-return]
        s.nondeterministic(s.cursor, recorded.describe(), f"side effect {op_id!r}")
        raise Halt
    value: Any = fn()
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never awaited, on purpose
        s.definition_error(
            "ctx.side_effect takes a plain function; do I/O in a step instead of awaiting here"
        )
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    dumps(value)  # must be JSON, or SerializationError now rather than at append time
    check_storable(value, f"the value of {op_id}")
    _emit(s, SideEffectRecorded(at=s.now, op_id=op_id, value=value))
    return value  # type: ignore[no-any-return]


def patched(s: SagaState, patch_id: str) -> bool:
    if patch_id in s.patches:
        return s.patches[patch_id]
    if s.nondeterminism is not None:
        raise Halt
    if s.cursor < len(s.history):
        recorded = s.history[s.cursor]
        found = isinstance(recorded, PatchMarked) and recorded.patch_id == patch_id
        if found:
            s.cursor += 1
    else:
        _emit(s, PatchMarked(at=s.now, patch_id=patch_id))
        found = True
    s.patches[patch_id] = found
    return found


def _rng(s: SagaState) -> random.Random:
    # Seeded from the saga id on first use: most sagas never ask for randomness, and
    # seeding costs more than the rest of a reply's bookkeeping.
    if s.rng is None:
        s.rng = random.Random(hashlib.sha256(s.saga_id.encode()).digest())
    return s.rng


def deterministic_uuid(s: SagaState) -> uuid.UUID:
    return uuid.UUID(int=_rng(s).getrandbits(128), version=4)


def deterministic_random(s: SagaState) -> float:
    return _rng(s).random()


def parse(model: type[M], payload: JsonDict, what: str, step: str | None = None) -> M:
    try:
        return validate_payload(model, payload, what)
    except InvalidPayload as exc:
        exc.step = step  # the saga's error names the step whose reply it was
        raise


def declared_signal(
    s: SagaState, signal: Signal[Any] | str, model: type[BaseModel] | None
) -> Signal[Any]:
    """The saga's declaration of ``signal``; DefinitionError (raised in the saga's code)
    when it declares no such signal, or declares it with another model."""
    name = signal.name if isinstance(signal, Signal) else signal
    declared = s.definition.signals.get(name) if isinstance(name, str) else None
    cls_name = s.definition.cls.__name__
    if declared is None:
        hint = model.__name__ if model is not None else "MyPayload"
        s.definition_error(
            f"{cls_name} waits for signal {name!r} but does not declare it, so the engine "
            f"would refuse it; add `{name} = Signal({hint})` to the class, deploy, and "
            "resume the saga"
        )
    wanted = signal.model if isinstance(signal, Signal) else model
    if wanted is not None and wanted is not declared.model:
        s.definition_error(
            f"{cls_name} waits for signal {name!r} as {wanted.__name__}, but declares it "
            f"with {declared.model.__name__}; use the declared model, deploy, and resume"
        )
    return declared


# --------------------------------------------------------------------------- operators


def release(s: SagaState, inflight: InFlight, payload: JsonDict, *, by_operator: bool) -> None:
    """Answers a waiting forward step with ``payload``: an operator's skip
    (``by_operator``), or its held reply accepted on retry. The saga goes back to running
    once nothing is held.

    A step its participant never answered, done by hand, owes no compensation. One
    whose reply was held did reach its participant, which applied it: its compensation
    stays owed."""
    if by_operator and inflight.held is None:
        s.skipped_ids = with_id(s.skipped_ids, inflight.event.command_id)
    inflight.held = None
    inflight.future.set_result(
        ReplyReceived(
            at=s.now,
            step=inflight.event.step,
            command_id=inflight.event.command_id,
            outcome="success",
            payload=payload,
        )
    )
    s.settle_held()


def request_cancel(
    s: SagaState, reason: Literal["cancel", "deadline", "forced"], message: str
) -> None:
    """Stops the user's run; the lifecycle then compensates what is owed."""
    if s.cancel_reason is not None or s.closing:
        return
    s.cancel_reason = reason
    s.cancel_message = message
    if s.user_task is not None and not s.user_task.done():
        s.user_task.cancel()


def unblock_compensation(s: SagaState, action: Literal["retry", "skip"]) -> None:
    """An operator's answer to the stuck compensation, if one waits: retry it, or count it
    done by hand (its step_skipped)."""
    if s.resume_waiter is not None and not s.resume_waiter.done():
        s.resume_waiter.set_result(action)


# --------------------------------------------------------------------------- lifecycle


def _owe(s: SagaState, step: str, spec: CompensationSpec | None, sent: list[str]) -> None:
    """``step`` was (or may have been) applied: its compensation, if it has one, is owed."""
    if spec is not None:
        s.owed.append(OwedCompensation(step, spec, tuple(sent)))


async def _run_user(s: SagaState, started: SagaStarted) -> Any:
    saga = s.definition.cls()
    value = s.definition.input_type.model_validate(started.input)
    return await saga.run(s.ctx, value)


async def _finish_stragglers(s: SagaState) -> None:
    """Stops the run's other tasks (a gather's siblings still in flight)."""
    s.closing = True
    s.timers.pop(DEADLINE_TIMER, None)  # the run is over; the deadline no longer applies
    pending = [t for t in s.loop.tasks if t is not s.lifecycle and not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


async def run_lifecycle(s: SagaState, started: SagaStarted) -> None:
    """The saga's whole run: the user's code, then completion, failure or compensation."""
    s.user_task = s.loop.create_task(_run_user(s, started))
    error: ErrorInfo | None = None
    try:
        result = await s.user_task
    except asyncio.CancelledError:
        pass
    except (Halt, GeneratorExit):
        raise  # nondeterminism, or the runtime is being discarded: no more code runs
    except DefinitionError as exc:
        # The code misused the engine somewhere ctx could not catch it (the asyncio
        # clock, say): parked like the rest, not compensated.
        s.definition_error(str(exc))
    except BaseException as exc:  # the run failed: compensate
        error = error_info(exc, None if isinstance(exc, SignalTimeout) else s.current_step)
    else:
        if s.cancel_reason is None:
            try:
                output = _serialize_output(s, result)
            except SagaError as exc:
                error = error_info(exc)
            else:
                await _finish_stragglers(s)
                _emit(s, SagaCompleted(at=s.now, output=output))
                if started.parent is not None:
                    await _undo_when_asked(s)
                return
    await _finish_stragglers(s)
    reason: Literal["failure", "cancel", "deadline", "operator"] = (
        "operator" if s.cancel_reason == "forced" else s.cancel_reason or "failure"
    )
    if s.cancel_reason == "forced":
        error = ErrorInfo(type="OperatorForcedCompensation", message=s.cancel_message)
    elif s.cancel_reason == "deadline":
        error = ErrorInfo(type="DeadlineExceeded", message=s.cancel_message)
    elif s.cancel_reason == "cancel":
        error = ErrorInfo(type="SagaCancelled", message=s.cancel_message)
    assert error is not None
    owed = list(reversed(s.owed))
    if owed:
        _emit(
            s,
            CompensationStarted(at=s.now, reason=reason, error=error, owed=[o.step for o in owed]),
        )
        for entry in owed:
            await _compensate(s, entry)
    if reason == "cancel":
        _emit(s, SagaCancelled(at=s.now, reason=s.cancel_message))
    elif owed:
        _emit(s, SagaCompensated(at=s.now, error=error))
    else:
        _emit(s, SagaFailed(at=s.now, error=error))


async def _undo_when_asked(s: SagaState) -> None:
    """A completed child waits for its parent's undo (an ``undo_requested`` input): then
    it compensates its applied steps, last first, and ends compensated. With nothing to
    undo it stays completed (its end still answers the undo)."""
    s.undo_waiter = s.loop.create_future()
    await s.undo_waiter
    s.undo_waiter = None
    owed = list(reversed(s.owed))
    if not owed:
        return
    error = ErrorInfo(type="ParentCompensating", message=s.cancel_message)
    _emit(s, CompensationStarted(at=s.now, reason="undo", error=error, owed=[o.step for o in owed]))
    for entry in owed:
        await _compensate(s, entry)
    _emit(s, SagaCompensated(at=s.now, error=error))


def request_undo(s: SagaState, parent_id: str, reason: str) -> None:
    """The parent compensates: a running child is cancelled (it compensates and ends
    cancelled); a completed one wakes to undo its steps; one already undoing goes on."""
    message = f"undone by parent saga {parent_id}" + (f": {reason}" if reason else "")
    if s.status == SagaStatus.COMPLETED:
        s.cancel_message = message
        if s.undo_waiter is not None and not s.undo_waiter.done():
            s.undo_waiter.set_result(None)
    elif s.going_forward:
        request_cancel(s, "cancel", message)


def _serialize_output(s: SagaState, result: Any) -> JsonDict:
    model = s.definition.output_type
    if not isinstance(result, model):
        try:
            result = model.model_validate(result)
        except ValidationError as exc:
            raise SerializationError(
                f"{s.definition.cls.__name__}.run returned {type(result).__name__}, "
                f"expected {model.__name__}: {exc}"
            ) from exc
    output = model_payload(result)
    check_storable(output, f"the output of {s.definition.cls.__name__}.run")
    return output


async def _compensate(s: SagaState, owed: OwedCompensation) -> None:
    spec = owed.spec
    timeout = timedelta(seconds=spec.timeout_s) if spec.timeout_s else None
    generation, round_attempts = 0, 0
    for attempt in itertools.count(1):
        round_attempts += 1
        issued = _emit(
            s,
            CompensationIssued(
                at=s.now,
                step=owed.step,
                participant=spec.participant,
                command_type=spec.command_type,
                payload=spec.payload,
                payload_hash=canonical_hash(spec.payload),
                command_id=command_id_for(s.saga_id, owed.step, generation, compensation=True),
                attempt=attempt,
                timeout_at=s.now + timeout if timeout else None,
                compensates=list(owed.forward_ids),
            ),
        )
        reply = await _await_command(s, issued)
        if reply is not None and reply.outcome == "success":
            _emit(s, CompensationCompleted(at=s.now, step=owed.step))
            s.owed.remove(owed)  # no longer owed
            return
        if reply is None:
            last_error = "timed out"
        else:
            # A refused compensation is retried under a new id: the participant stored
            # its refusal under the old one and would only repeat it.
            generation += 1
            last_error = reply.error or reply.outcome
        if round_attempts >= spec.retry.max_attempts:
            _emit(
                s,
                CompensationStuck(
                    at=s.now,
                    step=owed.step,
                    error=ErrorInfo(
                        type="CompensationStuck",
                        message=f"compensation of {owed.step!r} still failing after "
                        f"{round_attempts} attempts: {last_error}",
                        step=owed.step,
                    ),
                ),
            )
            # Parked until an operator answers (see unblock_compensation).
            s.resume_waiter = s.loop.create_future()
            s.stuck_step = owed.step
            action = await s.resume_waiter
            s.resume_waiter, s.stuck_step = None, None
            if action == "skip":
                # An operator compensated it by hand (recorded as step_skipped).
                s.owed.remove(owed)
                return
            round_attempts = 0
            continue
        delay = spec.retry.backoff(attempt, seed=f"{s.saga_id}:compensate:{owed.step}")
        await _timer(s, f"retry:compensate:{owed.step}:{attempt}", "retry", delay)

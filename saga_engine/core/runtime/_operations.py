"""What a saga's ``ctx`` does, as it runs on the deterministic loop.

Functions over one :class:`~saga_engine.core.runtime._state.SagaState`, called through the
runtime's side of the context's door (``SagaDriver``): steps (and children, which are
steps), timers, signals, side effects, patches, deterministic ids and randomness. A step
pushes its compensation on the saga's stack once it is (or may have been) applied; the
stack is run by ``_lifecycle``.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import random
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

from pydantic import BaseModel

from saga_engine.core.authoring._context import ChildSaga, StepRequest
from saga_engine.core.authoring._definition import Saga
from saga_engine.core.authoring._signal import Signal
from saga_engine.core.history._cost import LEARNED, Cost, cost_class, cost_refusal
from saga_engine.core.history._decision import (
    CHILD_PARTICIPANT,
    CHILD_STEP_PREFIX,
    ChildStart,
    ChildUndo,
    OutboundCommand,
    child_saga_id,
    command_id_for,
)
from saga_engine.core.history._events import (
    CommandIssued,
    CompensationSpec,
    ErrorInfo,
    NodeSkipped,
    PatchMarked,
    PivotPassed,
    RetryRequested,
    SagaStarted,
    SideEffectRecorded,
    StepParked,
    StepSkipped,
    TimerStarted,
)
from saga_engine.core.history._fold import owned, with_id
from saga_engine.core.history._policy import (
    DEFAULT_COMPENSATION_RETRY,
    DEFAULT_COMPENSATION_TIMEOUT,
    DEFAULT_STEP_RETRY,
    RetryPolicy,
    retry_after,
)
from saga_engine.core.history._structs import replace
from saga_engine.core.runtime._intents import (
    await_timer,
    check_open,
    command_future,
    emit,
    forget_command,
    next_id,
)
from saga_engine.core.runtime._state import Halt, Poll, SagaState
from saga_engine.core.runtime._undo import give_up
from saga_engine.kernel._errors import (
    InvalidPayload,
    PayloadTooLarge,
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
    storable_hash,
    type_name,
    validate_payload,
)
from saga_engine.kernel._settings import LimitsSettings, check_message_size

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CommandLimit:
    """The one size rule (``check_message_size``) for the commands a saga's code issues:
    ``measure`` gives the bytes a command is as the runner sends it (its value and
    headers, sealed by its codec), ``limit`` is ``kafka.max_message_bytes``."""

    limit: int
    measure: Callable[[OutboundCommand], int]
    #: Flow control's settings: the cost classes a step may name and the budgets no
    #: cost may exceed (None: costs are recorded as declared, unchecked).
    limits: LimitsSettings | None = None
    #: What a step of a saga type was measured to cost (``cost="learned"``): the
    #: runner's table of learned costs (None: a learned cost costs nothing).
    learned: Callable[[str, str], Cost | None] | None = None
    #: The events in one run past which ``ctx.should_continue_as_new()`` says True
    #: (``engine.continue_as_new_after``; None: ``_continuing.DEFAULT_RUN_EVENTS``).
    run_events: int | None = None
    #: At least ``measure(command)``, cheaper to compute (None: no cheap bound): a
    #: command whose bound fits is not measured (``CommandRecords.bound``).
    bound: Callable[[OutboundCommand], int | None] | None = None

    def refusal(self, command: OutboundCommand, what: str) -> str | None:
        """Why ``command`` cannot be sent (None: it fits)."""
        if self.bound is not None:
            # Measuring builds the whole record (about 96 k instructions, bench.instructions);
            # a bound that fits says as much in about a tenth of that.
            ceiling = self.bound(command)
            if ceiling is not None and ceiling <= self.limit:
                return None
        try:
            check_message_size(self.measure(command), self.limit, what)
        except PayloadTooLarge as exc:
            return str(exc)
        return None


#: The ``op_id`` of the record that a step's command was refused as too large.
_TOO_LARGE = "too_large:"


def step(
    s: SagaState, request: StepRequest, limit: CommandLimit | None = None
) -> Coroutine[Any, Any, JsonDict]:
    """Sends the step's command until it is answered, per its retry policy; returns
    the success reply's payload. Raises StepFailed or StepTimedOut (a command, or its
    compensation, above ``limit``: StepFailed before anything is sent).

    Not a coroutine itself: awaited at once by the code that calls it (``ctx.step``), it
    checks and prepares the step and returns the one coroutine that waits for its
    replies (a coroutine fewer held by every waiting saga)."""
    check_open(s)
    _check_step(s, request)
    s.step_names = with_id(s.step_names, request.name)
    if request.after is not None:
        s.declared_after = owned(s.declared_after)
        s.declared_after[request.name] = request.after
    # Refused here, in the saga's code, rather than by Postgres when the command is
    # appended (which would lose the input being handled). A replayed command was
    # stored, so it is storable: no need to look again.
    live = s.cursor >= len(s.history)
    payload = model_payload(request.command)
    # Hashed once, for every attempt (replayed: only hashed, to match the recorded one).
    payload_hash = storable_hash(payload) if live else canonical_hash(payload)
    if payload_hash is None:
        check_storable(payload, f"the command of step {request.name!r}")
        payload_hash = canonical_hash(payload)
    spec = _compensation(request, live)
    # Its first id, derived once: measured (``_check_size``) and issued with it. A
    # replayed command is the recorded one, id and all: none derived (``_attempts``).
    command_id = _attempt_id(s, request.name, 0)
    _check_size(s, request, payload, command_id, spec, limit)
    if request.cost is not None:  # (_priced has nothing to price otherwise)
        request = _priced(s, request, limit)
    return _attempts(s, request, payload, payload_hash, command_id, spec)


def _passed(s: SagaState, request: StepRequest, result: JsonDict) -> JsonDict:
    """The step succeeded (or an operator skipped it): a pivot passed is recorded."""
    if request.pivot:
        emit(s, PivotPassed(at=s.now, step=request.name))
    return result


def _check_step(s: SagaState, request: StepRequest) -> None:
    """The step as the code wrote it must be one the engine can record and replay."""
    name = request.name
    if not isinstance(name, str) or not name:
        s.definition_error("a step needs a non-empty string name")
    if name in s.step_names:
        s.definition_error(
            f"step name {name!r} is used twice in one run of saga {s.saga_type!r}; each "
            f'step needs a stable, unique name (in a loop, use e.g. f"{name}-{{i}}")'
        )
    # Each checked as it stands (no tuple of both walked): every step, replayed or live.
    command, compensate = request.command, request.compensate
    if command is not None and not isinstance(command, BaseModel):
        _not_a_model(s, name, "command", command)
    if compensate is not None and not isinstance(compensate, BaseModel):
        _not_a_model(s, name, "compensate", compensate)
    returns = request.returns
    if returns is not None and not (isinstance(returns, type) and issubclass(returns, BaseModel)):
        s.definition_error(f"step {name!r}: returns must be a pydantic model class")
    if request.pivot and s.pivot_step not in (None, name):
        s.definition_error(
            f"step {name!r} is a second pivot of saga {s.saga_type!r} (the first is "
            f"{s.pivot_step!r}); a saga has one pivot step"
        )


def _not_a_model(s: SagaState, name: str, what: str, value: object) -> NoReturn:
    s.definition_error(f"step {name!r}: {what} must be a pydantic model, got {value!r}")


def _check_size(
    s: SagaState,
    request: StepRequest,
    payload: JsonDict,
    command_id: str,
    spec: CompensationSpec | None,
    limit: CommandLimit | None,
) -> None:
    """A step whose command (or compensation) is too large for the broker fails before
    its command is recorded: it could never be sent, and a send retried for ever would
    hold the saga's inbox. The refusal is recorded (a ``side_effect_recorded`` whose
    ``op_id`` is ``too_large:<step>``), so that a replay fails the step the same way
    whatever limit the replaying process has, and a step recorded as issued is never
    measured again."""
    name = request.name
    op_id = _TOO_LARGE + name
    if s.cursor < len(s.history):
        recorded = s.history[s.cursor]
        if not (isinstance(recorded, SideEffectRecorded) and recorded.op_id == op_id):
            return  # issued (or the code changed: _issue says so)
        error = None
    else:
        if limit is None:
            return  # a replay tool reading on past the history: nothing is sent
        forward = _outbound(s, request, payload, command_id)
        error = limit.refusal(forward, f"the command of step {name!r}")
        if error is None and spec is not None:
            undo = OutboundCommand(
                saga_id=s.saga_id,
                saga_type=s.saga_type,
                step=name,
                participant=request.to,
                command_type=spec.command_type,
                payload=spec.payload,
                # Its own id is derived once, when it is issued (``_undo``): measured,
                # any id of the same length weighs the same (a uuid's text is always 36
                # characters), so the forward one stands in for it.
                command_id=forward.command_id,
                attempt=1,
                compensation=True,
                trace_context=s.trace_context,
                compensates=(forward.command_id,),
            )
            error = limit.refusal(undo, f"the compensation of step {name!r}")
        if error is None:
            return
    event = emit(s, SideEffectRecorded(at=s.now, op_id=op_id, value={"error": error}))
    raise StepFailed(name, str(event.value["error"]))


#: The ``op_id`` of the record that a step's cost was refused: above a whole budget.
_OVER_BUDGET = "over_budget:"


def _priced(s: SagaState, request: StepRequest, limit: CommandLimit | None) -> StepRequest:
    """(A step that declares a cost: ``step`` asks only then.) The step with its cost as amounts (a named class resolved from the settings).

    A cost above a whole budget of its gates (in the saga's flow policy) fails the step
    before its command is recorded, as a command too large does (``_check_size``): it
    could never be sent. The
    refusal is recorded (``op_id`` ``over_budget:<step>``) so that a replay fails it the
    same way whatever the settings then; a command recorded as issued is never checked
    again (its recorded cost is the one it is sent with)."""
    name = request.name
    op_id = _OVER_BUDGET + name
    replaying = s.cursor < len(s.history)
    if replaying:
        recorded = s.history[s.cursor]
        if not (isinstance(recorded, SideEffectRecorded) and recorded.op_id == op_id):
            return _resolved(s, request, limit, replaying)  # issued (or the code changed)
        error = None
    else:
        request = _resolved(s, request, limit, replaying)
        limits = limit.limits if limit is not None else None
        if limits is None or not isinstance(request.cost, Cost):
            return request
        what = f"the command of step {name!r}"
        version = _flow_policy(s)
        named = limits.resolve(version) if len(limits.versions) > 1 else None
        policy = limits.policy(version)
        error = cost_refusal(request.cost, policy, request.to, s.saga_type, what, named)
        if error is None:
            return request
    event = emit(s, SideEffectRecorded(at=s.now, op_id=op_id, value={"error": error}))
    raise StepFailed(name, str(event.value["error"]))


def _resolved(
    s: SagaState, request: StepRequest, limit: CommandLimit | None, replaying: bool
) -> StepRequest:
    """The step with its cost a ``Cost``: a class's name looked up in the settings. An
    unknown name, or a cost of another type, is a definition error (the saga parks until
    the settings or the code are fixed); replayed, its recorded command carries the cost
    it was sent with, and a replay tool (no settings) sends nothing."""
    cost = request.cost
    if isinstance(cost, Cost):
        return request
    if cost == LEARNED:  # what it was measured to cost; nothing until it has been
        learned = limit.learned if limit is not None else None
        limits = limit.limits if limit is not None else None
        if limits is not None and not limits.policy(_flow_policy(s)).learned_costs:
            learned = None  # the saga's flow policy prices no step by what it measured
        measured = learned(s.saga_type, request.name) if learned is not None else None
        return replace(request, cost=measured)
    if not isinstance(cost, str):
        s.definition_error(
            f"step {request.name!r}: cost must be a Cost, the name of a cost class or None, "
            f"got {cost!r}"
        )
    limits = limit.limits if limit is not None else None
    found = cost_class(cost, limits) if limits is not None else None
    if isinstance(found, str) and not replaying:
        s.definition_error(f"step {request.name!r}: {found}")
    return replace(request, cost=found if isinstance(found, Cost) else None)


def _flow_policy(s: SagaState) -> int | None:
    """The flow policy the saga's start recorded (None: 1)."""
    started = s.history[0] if s.history else None
    return started.flow_policy if isinstance(started, SagaStarted) else None


def _outbound(
    s: SagaState, request: StepRequest, payload: JsonDict, command_id: str
) -> OutboundCommand:
    """The step's first command as the runner would send it."""
    return OutboundCommand(
        saga_id=s.saga_id,
        saga_type=s.saga_type,
        step=request.name,
        participant=request.to,
        command_type=type_name(request.command),
        payload=payload,
        command_id=command_id,
        attempt=1,
        compensation=False,
        trace_context=s.trace_context,
    )


def _compensation(request: StepRequest, live: bool) -> CompensationSpec | None:
    """What undoes the step, recorded with its command (None: nothing to undo)."""
    if request.compensate is None:
        return None
    payload = model_payload(request.compensate)
    if live:
        check_storable(payload, f"the compensation of step {request.name!r}")
    return CompensationSpec(
        participant=request.to,
        command_type=type_name(request.compensate),
        payload=payload,
        retry=request.compensate_retry or DEFAULT_COMPENSATION_RETRY,
        timeout_s=(request.timeout or DEFAULT_COMPENSATION_TIMEOUT).total_seconds(),
    )


async def _attempts(
    s: SagaState,
    request: StepRequest,
    payload: JsonDict,
    payload_hash: str,
    command_id: str,
    spec: CompensationSpec | None,
) -> JsonDict:
    """``payload``: the command's, and ``payload_hash`` its hash (apart, not a tuple:
    held while the step waits); ``command_id``: its first generation's id ("": not
    derived, the step began in replay). Each attempt's reply is awaited here
    (``command_future``), not in a coroutine of its own: see ``step``."""
    name, policy = request.name, request.retry or DEFAULT_STEP_RETRY
    generation, attempt, rounds, unknown, last_error = 0, 0, 0, False, ""
    id_generation = 0  # the generation command_id is of
    sent: tuple[str, ...] = ()  # (a tuple: held while the step waits)
    began = s.tick()
    while True:
        attempt, rounds = attempt + 1, rounds + 1
        if generation != id_generation or not command_id:
            command_id, id_generation = _attempt_id(s, name, generation), generation
        issued = _issue(s, request, payload, payload_hash, command_id, attempt, spec)
        if issued.command_id not in sent:
            sent = (*sent, issued.command_id)
        future = command_future(s, issued, request.returns)
        try:
            reply = await future
        except BaseException as stopped:
            forget_command(s, issued)
            if isinstance(stopped, asyncio.CancelledError):
                # Stopped in flight: it may or may not have been applied.
                give_up(s, name, spec, sent, began, in_doubt=True, cancelled=stopped)
            raise
        forget_command(s, issued)
        failed: StepFailed | StepTimedOut | None = None
        if reply is None:
            unknown, last_error = True, "timed out"
        elif reply.outcome == "success":
            if issued.command_id not in s.skipped_ids:  # (see _lifecycle.answer_waiting_step)
                s.owe(name, spec, sent, began)
            return _passed(s, request, reply.payload)
        elif reply.outcome == "failure":  # refused: nothing was applied under its id
            unknown, last_error = False, reply.error or "refused by participant"
            failed = StepFailed(name, last_error, details=reply.payload)
        else:  # retryable: the participant says nothing was applied
            generation, unknown, last_error = generation + 1, False, reply.error or "retryable"
        if failed is None and rounds >= policy.max_attempts:
            failed = (
                StepTimedOut(name, attempt)
                if unknown
                else StepFailed(name, f"gave up after {attempt} attempts: {last_error}")
            )
        if failed is not None:
            if not (s.past_pivot or policy.on_exhausted == "park"):
                if unknown:
                    s.owe(name, spec, sent, began)
                raise failed
            answer = await _park(s, request, failed, unknown, spec, sent, began)
            if isinstance(answer, StepSkipped):
                return _passed(s, request, answer.payload)
            if answer.command is not None or (reply is not None and reply.outcome == "failure"):
                # An edited command, or one its participant refused (and stored its
                # refusal under the old id), goes under a new id: the next generation.
                generation += 1
            if answer.command is not None:
                payload, payload_hash = answer.command, canonical_hash(answer.command)
            rounds = 0
            continue
        try:
            check_open(s)
            delay = max(policy.backoff(attempt, seed=f"{s.saga_id}:{name}"), retry_after(reply))
            await await_timer(s, f"retry:{name}:{attempt}", "retry", delay)
        except asyncio.CancelledError as cancelled:
            # Stopped while waiting to retry: after a timeout the last attempt may have
            # been applied, so its compensation is owed.
            give_up(s, name, spec, sent, began, in_doubt=unknown, cancelled=cancelled)
            raise


def _attempt_id(s: SagaState, name: str, generation: int) -> str:
    """The command id of an attempt issued live. "" for one replayed: it is matched
    against the recorded one, which ``emit`` returns with its id (none derived: a SHA-1
    per step saved on replay)."""
    if s.cursor >= len(s.history):
        return command_id_for(s.scope, name, generation, compensation=False)
    return ""


def _issue(
    s: SagaState,
    request: StepRequest,
    payload: JsonDict,
    payload_hash: str,
    command_id: str,
    attempt: int,
    spec: CompensationSpec | None,
) -> CommandIssued:
    """Records (or on replay matches) one attempt of a forward step's command; a polled
    one (``StepRequest.poll``) is sent again at its period until answered."""
    timeout = request.timeout
    issued = emit(
        s,
        CommandIssued(
            at=s.now,
            step=request.name,
            participant=request.to,
            command_type=type_name(request.command),
            payload=payload,
            payload_hash=payload_hash,
            command_id=command_id,
            attempt=attempt,
            timeout_at=s.now + timeout if timeout else None,
            compensation=spec,
            pivot=request.pivot,
            cost=request.cost.as_dict() if type(request.cost) is Cost else None,
        ),
    )
    if request.poll is not None:
        s.polls = owned(s.polls)
        s.polls[issued.command_id] = Poll(request.poll, issued.at + request.poll)
    return issued


async def _park(
    s: SagaState,
    request: StepRequest,
    failed: StepFailed | StepTimedOut,
    unknown: bool,
    spec: CompensationSpec | None,
    sent: Sequence[str],
    began: int,
) -> RetryRequested | StepSkipped:
    """The step cannot succeed by retrying, and it parks rather than compensating (its
    policy says so, or the saga is past its pivot): the saga is step_stuck until an
    operator retries the step or skips it. Returns the operator's answer."""
    name = request.name
    try:
        check_open(s)
        emit(
            s,
            StepParked(
                at=s.now,
                step=name,
                in_doubt=unknown,
                past_pivot=s.past_pivot,
                error=ErrorInfo(
                    type="StepParked",
                    message=f"{failed}; the step waits for an operator: retry it (with an "
                    "edited command if need be) or skip it with a result",
                    step=name,
                    details={"cause": type(failed).__name__, "past_pivot": s.past_pivot},
                ),
            ),
        )
        parked = s.parked_steps[name]
        future: asyncio.Future[RetryRequested | StepSkipped] = s.loop.create_future()
        parked.future, parked.returns = future, request.returns
        parked.command_model = type(request.command)
        answer = await future
    except asyncio.CancelledError as cancelled:
        # Stopped while parked: the last attempt may have been applied (unknown).
        give_up(s, name, spec, sent, began, in_doubt=unknown, cancelled=cancelled)
        raise
    if isinstance(answer, StepSkipped) and unknown:
        # Done by hand, but an attempt may have been applied too: its undo stays owed.
        s.owe(name, spec, sent, began)
    return answer


#: A child's start has no timeout: its poll asks again without recording an attempt (see
#: ``StepRequest.poll``), so the child is waited for as long as it runs. Its attempts
#: count only starts the engine answered "retryable", sent anew one second apart.
CHILD_RETRY = RetryPolicy(
    max_attempts=10_000,
    initial_backoff=timedelta(seconds=1),
    max_backoff=timedelta(seconds=1),
    jitter=0.0,
)


async def child(
    s: SagaState,
    saga: type[ChildSaga[Any]],
    input: BaseModel | JsonDict,
    *,
    key: str | None,
    poll: timedelta | None,
    retry: RetryPolicy | None,
    pivot: bool = False,
    limit: CommandLimit | None = None,
) -> JsonDict:
    """Starts a child saga and waits for its end: a step whose participant is the engine
    (see ``CHILD_PARTICIPANT``), so it is recorded, re-sent, compensated and cancelled
    like any step (a start too large to send fails it, as ``step``'s command). Its id
    derives from this saga's id and ``key``."""
    check_open(s)
    if not (isinstance(saga, type) and issubclass(saga, Saga)):
        s.definition_error(f"ctx.child needs a Saga class, got {saga!r}")
    name = key if key is not None else saga.name
    if not isinstance(name, str) or not name:
        s.definition_error("ctx.child needs a non-empty string id")
    child_id = child_saga_id(s.scope, name)
    started = s.history[0]
    assert isinstance(started, SagaStarted)
    raw = input.model_dump(mode="json", by_alias=True) if isinstance(input, BaseModel) else input
    value = validate_payload(saga.input_type, raw, f"the input of child saga {name!r}")
    start = ChildStart(
        saga_id=child_id,
        saga_type=saga.name,
        input=model_payload(value),
        priority=started.priority,
        fairness_key=started.fairness_key,
        flow_policy=started.flow_policy,
    )
    return await step(
        s,
        StepRequest(
            f"{CHILD_STEP_PREFIX}{name}",
            CHILD_PARTICIPANT,
            start,
            ChildUndo(saga_id=child_id, saga_type=saga.name),
            retry or CHILD_RETRY,
            returns=saga.output_type,
            pivot=pivot,
            poll=poll,
        ),
        limit,
    )


async def sleep(s: SagaState, delay: timedelta) -> None:
    check_open(s)
    await await_timer(s, f"sleep:{next_id(s, 'sleep')}", "sleep", delay)


async def wait_signal(s: SagaState, name: str, timeout: timedelta | None) -> JsonDict:
    check_open(s)
    buffered = s.signals.get(name)
    if buffered:
        return buffered.popleft()
    if name in s.signal_waiters:
        s.definition_error(f"two waits for signal {name!r} at once; wait for it in one place")
    future: asyncio.Future[JsonDict | None] = s.loop.create_future()
    s.signal_waiters = owned(s.signal_waiters)
    s.signal_waiters[name] = future
    timer_id = None
    if timeout is not None:
        timer_id = f"signal:{name}:{next_id(s, 'signal:' + name)}"
        emit(
            s,
            TimerStarted(
                at=s.now, timer_id=timer_id, purpose="signal_timeout", fire_at=s.now + timeout
            ),
        )
        timer_future: asyncio.Future[None] = s.loop.create_future()
        timer_future.add_done_callback(
            lambda _: future.done() or future.set_result(None)  # type: ignore[func-returns-value]
        )
        s.timers[timer_id].future = timer_future
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
    check_open(s)
    op_id = f"side_effect:{next_id(s, 'side_effect')}"
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
    emit(s, SideEffectRecorded(at=s.now, op_id=op_id, value=value))
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
        emit(s, PatchMarked(at=s.now, patch_id=patch_id))
        found = True
    s.patches = owned(s.patches)
    s.patches[patch_id] = found
    return found


def skip_node(s: SagaState, node: str) -> None:
    """A graph saga's node whose ``when`` was false: recorded, owing nothing."""
    check_open(s)
    s.step_names = with_id(s.step_names, node)
    emit(s, NodeSkipped(at=s.now, node=node))


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

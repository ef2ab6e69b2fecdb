"""The saga's run around the user's ``run``, and the compensation stack it unwinds.

The lifecycle (:func:`run_lifecycle`) runs the user's code, then records how it ended:
completed, or failed, cancelled or compensated. The compensation stack is pushed by the
steps (``SagaState.owe``) as they are applied, and unwound by ``_undo`` (in what order,
and what at once). A completed child waits for its parent's undo (:func:`request_undo`).
The rest is what an input does to a waiting run: a cancel (:func:`request_cancel`), a
step answered by an operator (:func:`answer_waiting_step`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Literal, NoReturn

from pydantic import BaseModel, ValidationError

from saga_engine.core.history._concurrency_keys import key_value
from saga_engine.core.history._decision import DEADLINE_TIMER
from saga_engine.core.history._events import (
    ErrorInfo,
    KeyAcquired,
    KeyQueued,
    ReplyReceived,
    SagaCancelled,
    SagaCompensated,
    SagaCompleted,
    SagaFailed,
    SagaStarted,
)
from saga_engine.core.history._fold import Sent, with_id
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.runtime._intents import emit
from saga_engine.core.runtime._loop import yield_once
from saga_engine.core.runtime._state import Halt, SagaState
from saga_engine.core.runtime._undo import finish_given_up, unwind
from saga_engine.kernel._errors import (
    DefinitionError,
    InvalidPayload,
    SagaError,
    SerializationError,
    SignalTimeout,
    StepFailed,
)
from saga_engine.kernel._serde import JsonDict, check_storable, model_payload


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


# --------------------------------------------------------------------------- operators


def answer_waiting_step(s: SagaState, sent: Sent, payload: JsonDict, *, by_operator: bool) -> None:
    """Answers a waiting forward step with ``payload``: an operator's skip
    (``by_operator``), or its held reply accepted on retry (the fold has let go of it,
    and of step_stuck once nothing is held).

    A step its participant never answered, done by hand, owes no compensation. One
    whose reply was held did reach its participant, which applied it: its compensation
    stays owed."""
    if by_operator and sent.held is None:
        s.skipped_ids = with_id(s.skipped_ids, sent.event.command_id)
    sent.held = None
    assert sent.future is not None
    sent.future.set_result(
        ReplyReceived(
            at=s.now,
            step=sent.event.step,
            command_id=sent.event.command_id,
            outcome="success",
            payload=payload,
        )
    )


def request_cancel(
    s: SagaState, reason: Literal["cancel", "deadline", "forced"], message: str
) -> None:
    """Stops the user's run; the lifecycle then compensates what is owed."""
    if s.cancel_reason is not None or s.closing:
        return
    s.cancel_reason = reason
    s.cancel_message = message
    if s.user_running and s.lifecycle is not None:
        s.lifecycle.cancel()  # the user's code runs in it (``run_lifecycle``)


# --------------------------------------------------------------------------- lifecycle


async def _hold_key(s: SagaState) -> None:
    """A limited saga's run begins once its history says it holds its key (a
    ``key_acquired`` input: the runner records it when the store grants a slot)."""
    if (s.key is not None and s.key.held) or _ran_without_key(s):
        return
    s.key_waiter = s.loop.create_future()
    try:
        await s.key_waiter
    finally:
        s.key_waiter = None


def _ran_without_key(s: SagaState) -> bool:
    """Its history shows its run under way before any key event: it was started before
    its type declared ``concurrency``, and goes on as it began (unlimited), not parked
    for a wait its history never recorded."""
    for event in s.history[1:]:
        if isinstance(event, KeyQueued | KeyAcquired):
            return False
        if event.is_intent:
            return True
    return False


def _user_code(s: SagaState, started: SagaStarted) -> Coroutine[Any, Any, Any]:
    """The user's code as ``run_lifecycle`` awaits it: the saga's ``run`` itself, its
    object made and its input read first (a coroutine fewer held by every waiting saga
    than a wrapper that does both); a limited saga waits for its key first
    (``_run_keyed``). What making them raises, the lifecycle takes as the run's error."""
    limit = s.definition.concurrency
    if limit is not None and key_value(limit, started.input) is not None:
        return _run_keyed(s, started)
    saga = s.saga = s.definition.cls()
    return saga.run(s.ctx, _run_input(s, started))


async def _run_keyed(s: SagaState, started: SagaStarted) -> Any:
    saga = s.saga = s.definition.cls()
    await _hold_key(s)
    return await saga.run(s.ctx, _run_input(s, started))


def _run_input(s: SagaState, started: SagaStarted) -> BaseModel:
    # A run that continued as new starts from the input it was given (``_continuing``).
    return s.definition.input_type.model_validate(
        started.input if s.run_input is None else s.run_input
    )


def _stop_stragglers(s: SagaState, *, unwinding: bool) -> list[asyncio.Task[Any]]:
    """Stops the run's other tasks (a gather's siblings still in flight) and returns
    them: the lifecycle waits until they have ended. ``unwinding``: the run failed or was
    stopped, and what they had in flight joins the compensation stack; otherwise the run
    returned without them, and they are given up (a step that may have been applied is
    undone now: ``_undo.give_up``). A plain function, not a coroutine: most runs leave
    no task behind, and nothing is awaited then (see ``run_lifecycle``)."""
    s.closing = True
    s.unwinding = unwinding
    s.timers.pop(DEADLINE_TIMER, None)  # the run is over; the deadline no longer applies
    undoing = {task for _, task in s.given_up}  # compensations of steps given up go on
    pending = [
        t for t in s.loop.tasks if t is not s.lifecycle and not t.done() and t not in undoing
    ]
    for task in pending:
        task.cancel("the run returned without it" if not unwinding else None)
    return pending


async def run_lifecycle(s: SagaState, started: SagaStarted) -> None:
    """The saga's whole run: the user's code, then completion, failure or compensation.

    The user's code runs in this task (``s.user_running`` while it does: a cancel stops
    it, not what follows), then this goes on one callback later, where it went on when
    the user's code had a task of its own that this one awaited: what was scheduled in
    between (a sibling task's step) still runs first, so histories replay as recorded."""
    s.user_running = True
    try:
        result = await _user_code(s, started)
    except (Halt, GeneratorExit, KeyboardInterrupt, SystemExit):
        # Nondeterminism, or the runtime is being discarded: no more code runs.
        s.user_running = False
        raise
    except BaseException as exc:
        ended: BaseException | None = exc
    else:
        ended = None
    s.user_running = False
    await yield_once()  # (no clock: a bare yield to the loop)
    error: ErrorInfo | None = None
    if isinstance(ended, asyncio.CancelledError):
        pass
    elif isinstance(ended, DefinitionError):
        # The code misused the engine somewhere ctx could not catch it (the asyncio
        # clock, say): parked like the rest, not compensated.
        s.definition_error(str(ended))
    elif ended is not None:  # the run failed: compensate
        error = error_info(ended, None if isinstance(ended, SignalTimeout) else s.current_step)
    else:
        if s.cancel_reason is None:
            try:
                output = _serialize_output(s, result)
            except SagaError as exc:
                error = error_info(exc)
            else:
                # No coroutine made for a wait there is no need of (most runs): one
                # coroutine and frame fewer per saga (bench/README.md, "Replay cuts,
                # second round").
                if stopped := _stop_stragglers(s, unwinding=False):
                    await asyncio.gather(*stopped, return_exceptions=True)
                if s.given_up:  # (a cancel is refused once the run returned)
                    await finish_given_up(s)
                emit(s, SagaCompleted(at=s.now, output=output))
                if started.parent is not None:
                    await _undo_when_asked(s)
                return
    ended = None  # (its traceback holds the user's frames: not kept while undoing)
    if error is not None and s.past_pivot and s.cancel_reason is None:
        _failed_past_pivot(s, error)
    if stopped := _stop_stragglers(s, unwinding=True):
        await asyncio.gather(*stopped, return_exceptions=True)
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
    owed = await unwind(s, reason, error)
    if reason == "cancel":
        emit(s, SagaCancelled(at=s.now, reason=s.cancel_message))
    elif owed:
        emit(s, SagaCompensated(at=s.now, error=error))
    else:
        emit(s, SagaFailed(at=s.now, error=error))


def _failed_past_pivot(s: SagaState, error: ErrorInfo) -> NoReturn:
    """The run raised past its pivot. It must not compensate (the pivot cannot be
    undone), and a step that cannot succeed parks at the step already: what remains is
    an error in the code itself, parked like one (``definition_error``) until a fixed
    deploy and a resume."""
    message = (
        f"the run failed past its pivot {s.pivot_step!r} ({error.type}: {error.message}); "
        "it is not compensated: deploy a fix and resume the saga"
    )
    s.park(
        DefinitionError(message),
        "definition_error",
        ErrorInfo(type="FailedPastPivot", message=message, step=error.step),
    )
    raise Halt


async def _undo_when_asked(s: SagaState) -> None:
    """A completed child waits for its parent's undo (an ``undo_requested`` input): then
    it compensates its applied steps, last first, and ends compensated. With nothing to
    undo it stays completed (its end still answers the undo)."""
    s.undo_waiter = s.loop.create_future()
    await s.undo_waiter
    s.undo_waiter = None
    error = ErrorInfo(type="ParentCompensating", message=s.cancel_message)
    if await unwind(s, "undo", error):
        emit(s, SagaCompensated(at=s.now, error=error))


def request_undo(s: SagaState, parent_id: str, reason: str) -> None:
    """The parent compensates: a running child is cancelled (it compensates and ends
    cancelled); a completed one wakes to undo its steps; one already undoing goes on. A
    child past its pivot never gets here: it refuses the undo (``_inputs._undo``)."""
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

"""The admin API's operator actions on one saga: signal, cancel, resume, retry, skip,
force-compensate. Each is recorded in the saga's history with the token's name and the
given reason, and logged to ``saga_engine.admin.audit``.

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from fastapi import HTTPException

from saga_engine.admin._auth import Principal
from saga_engine.admin._deps import Caller, EngineDep, PartsDep
from saga_engine.admin._http_errors import api_router
from saga_engine.admin._route_helpers import ACTION_ERRORS, SagaIdPath, errors, load, saga_ref
from saga_engine.admin._schemas import (
    ActionResult,
    CancelRequest,
    ForceCompensateRequest,
    ResumeRequest,
    RetryRequest,
    SignalRequest,
    SkipRequest,
)
from saga_engine.core.history._events import (
    CancelRequested,
    CompensationForced,
    Event,
    RetryRequested,
    SagaResumed,
    SignalReceived,
    StepSkipped,
)
from saga_engine.core.views._view import saga_view_of
from saga_engine.kernel._errors import OutcomeUnknown, TransientError
from saga_engine.runner._engine import Engine

__all__ = ["router"]

audit = logging.getLogger("saga_engine.admin.audit")

router = api_router()

T = TypeVar("T")
Action = Literal["signal", "cancel", "resume", "retry", "skip", "force-compensate"]


async def _carry_out(
    engine: Engine,
    saga_id: str,
    action: Action,
    call: Callable[[], Awaitable[T]],
    recorded: Callable[[Event], bool],
) -> tuple[T | None, str | None]:
    """Runs an action and says honestly what happened. A transient failure (the broker
    did not take a command it decided, say) after the action was recorded is no failure
    of the action: it is accepted, and what it decided is owed from the history and sent
    when the broker takes it (the note says so). Recorded or not is read from the
    history; when that cannot be read either, the outcome is unknown."""
    before = (await engine.get(saga_ref(saga_id))).last_seq
    try:
        return await call(), None
    except TransientError as exc:
        failure = exc
    try:
        events = await engine.history(saga_id)
    except TransientError as exc:
        raise OutcomeUnknown(
            f"the {action} may or may not be recorded: it failed ({failure}) and the saga's "
            f"history cannot be read ({exc}); look at `saga history {saga_id}` before "
            "sending it again"
        ) from exc
    if not any(recorded(e) for e in events[before:]):
        raise TransientError(
            f"the {action} is not recorded ({failure}); nothing changed: send it again"
        ) from failure
    return None, (
        f"recorded; what it decided could not be sent yet ({failure}): it is owed from the "
        "saga's history and sent when the broker takes it"
    )


async def _done(
    engine: Engine,
    saga_id: str,
    action: Action,
    caller: Principal,
    **extra: Any,
) -> ActionResult:
    record = await engine.get(saga_id)
    return ActionResult(
        saga_id=saga_id,
        action=action,
        principal=caller.name,
        status=record.status,
        **extra,
    )


@router.post(
    "/sagas/{saga_id}/signal", response_model=ActionResult, responses=errors(*ACTION_ERRORS)
)
async def signal(
    saga_id: SagaIdPath, body: SignalRequest, caller: Caller, engine: EngineDep
) -> ActionResult:
    """Delivers a signal (the same ``signal_id`` twice is delivered once)."""
    signal_id = body.signal_id or str(uuid.uuid4())
    decision, note = await _carry_out(
        engine,
        saga_id,
        "signal",
        lambda: engine.signal(
            saga_ref(saga_id),
            body.name,
            body.payload,
            signal_id=signal_id,
            principal=caller.name,
            reason=body.reason,
        ),
        lambda e: isinstance(e, SignalReceived) and e.signal_id == signal_id,
    )
    dropped = (
        decision.dropped.value if decision is not None and decision.dropped is not None else None
    )
    audit.info(
        "signal %r (id %s) to saga %s by %s: %r%s",
        body.name,
        signal_id,
        saga_id,
        caller.name,
        body.reason,
        f" (dropped: {dropped})" if dropped else "",
    )
    return await _done(
        engine, saga_id, "signal", caller, signal_id=signal_id, dropped=dropped, note=note
    )


@router.post(
    "/sagas/{saga_id}/cancel", response_model=ActionResult, responses=errors(*ACTION_ERRORS)
)
async def cancel(
    saga_id: SagaIdPath, body: CancelRequest, caller: Caller, engine: EngineDep
) -> ActionResult:
    """Cancels a running saga: it compensates every step it owes, in reverse order."""
    _, note = await _carry_out(
        engine,
        saga_id,
        "cancel",
        lambda: engine.cancel(saga_ref(saga_id), body.reason, principal=caller.name),
        lambda e: isinstance(e, CancelRequested),
    )
    audit.info("cancel saga %s by %s: %r", saga_id, caller.name, body.reason)
    return await _done(engine, saga_id, "cancel", caller, note=note)


@router.post(
    "/sagas/{saga_id}/resume", response_model=ActionResult, responses=errors(*ACTION_ERRORS)
)
async def resume(
    saga_id: SagaIdPath, body: ResumeRequest, caller: Caller, engine: EngineDep
) -> ActionResult:
    """Resumes a parked saga: retries its stuck compensation, or goes on with a
    nondeterministic one once the code deployed now replays its history."""
    _, note = await _carry_out(
        engine,
        saga_id,
        "resume",
        lambda: engine.resume(saga_ref(saga_id), principal=caller.name, reason=body.reason),
        lambda e: isinstance(e, SagaResumed),
    )
    audit.info("resume saga %s by %s: %r", saga_id, caller.name, body.reason)
    return await _done(engine, saga_id, "resume", caller, note=note)


@router.post(
    "/sagas/{saga_id}/retry", response_model=ActionResult, responses=errors(*ACTION_ERRORS)
)
async def retry(
    saga_id: SagaIdPath, body: RetryRequest, caller: Caller, engine: EngineDep
) -> ActionResult:
    """Retries a step now: one waiting out its back-off, a stuck compensation, or a step
    parked after it could not succeed (with an edited ``command`` if given: 422 if its
    model refuses it, 409 if the step is not parked); or re-sends the command of a step
    waiting for its reply, under the same command id (its participant deduplicates)."""
    _, note = await _carry_out(
        engine,
        saga_id,
        "retry",
        lambda: engine.retry_step(
            saga_ref(saga_id),
            body.step,
            reason=body.reason,
            principal=caller.name,
            command=body.command,
        ),
        lambda e: isinstance(e, RetryRequested) and e.step == body.step,
    )
    edited = " with an edited command" if body.command is not None else ""
    audit.info(
        "retry step %r%s of saga %s by %s: %r", body.step, edited, saga_id, caller.name, body.reason
    )
    return await _done(engine, saga_id, "retry", caller, note=note)


@router.post("/sagas/{saga_id}/skip", response_model=ActionResult, responses=errors(*ACTION_ERRORS))
async def skip(
    saga_id: SagaIdPath, body: SkipRequest, caller: Caller, engine: EngineDep, parts: PartsDep
) -> ActionResult:
    """Skips a step: answers a step awaiting its reply with ``result`` (it will not be
    compensated), or marks a stuck compensation as done by hand (no ``result``)."""
    if body.result is None:
        record, events = await load(parts.store, saga_id)
        stuck = saga_view_of(events, saga_id=record.saga_id).stuck_steps
        if body.step not in stuck:
            raise HTTPException(
                422,
                f"skipping step {body.step!r} needs a result (the reply its code gets); "
                "only a stuck compensation is skipped without one"
                + (f" (stuck: {', '.join(map(repr, stuck))})" if stuck else ""),
            )
    _, note = await _carry_out(
        engine,
        saga_id,
        "skip",
        lambda: engine.skip_step(
            saga_ref(saga_id), body.step, body.result, reason=body.reason, principal=caller.name
        ),
        lambda e: isinstance(e, StepSkipped) and e.step == body.step,
    )
    audit.info("skip step %r of saga %s by %s: %r", body.step, saga_id, caller.name, body.reason)
    return await _done(engine, saga_id, "skip", caller, note=note)


@router.post(
    "/sagas/{saga_id}/force-compensate",
    response_model=ActionResult,
    responses=errors(*ACTION_ERRORS),
)
async def force_compensate(
    saga_id: SagaIdPath, body: ForceCompensateRequest, caller: Caller, engine: EngineDep
) -> ActionResult:
    """Makes a running saga undo what it did so far, in reverse order; it ends
    compensated."""
    _, note = await _carry_out(
        engine,
        saga_id,
        "force-compensate",
        lambda: engine.force_compensate(saga_ref(saga_id), body.reason, principal=caller.name),
        lambda e: isinstance(e, CompensationForced),
    )
    audit.info("force-compensate saga %s by %s: %r", saga_id, caller.name, body.reason)
    return await _done(engine, saga_id, "force-compensate", caller, note=note)

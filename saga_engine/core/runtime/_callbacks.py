"""``ctx.callback``: a signed URL a third party calls to complete the saga's wait.

The wait is an intent (``callback_awaited``: its name, its expiry, the key id and base
URL it is signed with), recorded before the code can read the URL, so the URL never
leaves the engine before the write that makes it answerable commits (the one path writes,
then sends). The URL is derived from that recorded event and the saga's id: a replay
derives the same one. Its expiry is a durable timer named after the wait.

An answer is an input (``CallbackInput``, from ``runner/_engine``'s check of the token):
checked against the wait's model before anything is recorded (a refused body is a 422
that changes nothing), recorded once (``callback_received``); the same body again is
dropped as a duplicate (the same answer), another one refused as a conflict.
"""

from __future__ import annotations

import asyncio
import hashlib
from datetime import timedelta
from typing import Any

import orjson
from pydantic import BaseModel

from saga_engine.core.authoring._context import StepRequest
from saga_engine.core.history._decision import CallbackInput, DropReason
from saga_engine.core.history._events import CallbackAwaited, CallbackReceived, Event
from saga_engine.core.history._fold import CallbackWait, Settled
from saga_engine.core.runtime._intents import check_open, emit, end_with_timer, next_id
from saga_engine.core.runtime._operations import CommandLimit, step
from saga_engine.core.runtime._state import Halt, SagaState
from saga_engine.core.runtime._undo import give_up_applied
from saga_engine.kernel._callback_tokens import CallbackClaims, callback_url, sign
from saga_engine.kernel._errors import (
    CallbackConflict,
    CallbackFailed,
    CallbackGone,
    CallbackTimeout,
    CallbackTokenInvalid,
)
from saga_engine.kernel._serde import JsonDict, check_storable, validate_payload

#: The longest a callback's name may be (it is part of its wait id, and of its URL).
MAX_NAME = 100


def body_digest(payload: JsonDict, failed: bool) -> str:
    """The digest that tells a repeated call from another one: the body as JSON with its
    keys sorted, and which URL it was posted to."""
    text = orjson.dumps([failed, payload], option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(text).hexdigest()


def make_callback(
    s: SagaState, name: str, model: type[BaseModel] | None, timeout: timedelta
) -> CallbackAwaited:
    """Records the wait (or on replay matches it) and registers the code's future."""
    check_open(s)
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or not name.isprintable():
        s.definition_error(f"ctx.callback's name must be 1 to {MAX_NAME} printable characters")
    if timeout <= timedelta(0):
        s.definition_error(f"ctx.callback({name!r}): its timeout must be positive, not {timeout}")
    keys = s.callback_keys
    signing = keys.signing_key if keys is not None else None
    if signing is None and not s.replaying:
        s.definition_error(
            f"ctx.callback({name!r}) needs a key to sign its URL: set callbacks.keys "
            "(SAGA_CALLBACKS__KEYS) on the engine, restart it, and resume the saga"
        )
    recorded = emit(
        s,
        CallbackAwaited(
            at=s.now,
            wait_id=f"callback:{name}:{next_id(s, 'callback:' + name)}",
            name=name,
            expires_at=s.now + timeout,
            key_id=signing or "",
            base_url=keys.base_url if keys is not None else "",
        ),
    )
    wait = s.callback_waits.get(recorded.wait_id)
    if wait is not None:
        wait.model = model
        wait.future = _future(s, recorded.wait_id)
    return recorded


def _future(s: SagaState, wait_id: str) -> asyncio.Future[CallbackReceived | None]:
    future: asyncio.Future[CallbackReceived | None] = s.loop.create_future()
    end_with_timer(s, wait_id, future)
    return future


def url_of(s: SagaState, event: CallbackAwaited) -> str:
    """The wait's URL, from its recorded event and the saga's id. A key that is no longer
    configured parks the saga (a configuration to fix, then a resume), never fails it."""
    keys = s.callback_keys
    claims = CallbackClaims(s.saga_id, event.wait_id, event.expires_at, event.key_id)
    try:
        if keys is None:
            raise CallbackTokenInvalid("no callback keys are configured here")
        return callback_url(event.base_url, sign(keys, claims))
    except CallbackTokenInvalid as exc:
        s.definition_error(
            f"the URL of callback {event.name!r} is signed with key {event.key_id!r}: {exc}; "
            "configure that key (callbacks.keys) and resume the saga"
        )


async def wait_callback(s: SagaState, event: CallbackAwaited) -> CallbackReceived:
    """The answer to the wait; CallbackTimeout when its timer fired first, CallbackFailed
    when the third party posted to its ``/fail`` URL. Awaiting it again gives the same."""
    wait = s.callback_waits.get(event.wait_id)
    future = wait.future if wait is not None else None
    if future is None:
        received = _received(s, event.wait_id)
        if received is None:
            raise CallbackTimeout(event.name, event.wait_id)
        return _answer(event, received)
    try:
        answer = await future
    except asyncio.CancelledError:
        # Given up by the code (a race lost, a scope's timer): the URL answers 410 now.
        close_wait(s, event.wait_id)
        raise
    if answer is None:
        raise CallbackTimeout(event.name, event.wait_id)
    return _answer(event, answer)


def close_wait(s: SagaState, wait_id: str) -> None:
    """The code no longer waits for callback ``wait_id``: its URL answers 410 from now on
    and its timer no longer wakes the saga (nothing is recorded: a replay of the same
    code closes it at the same point)."""
    s.callback_waits.pop(wait_id, None)
    s.timers.pop(wait_id, None)


async def callback_step(
    s: SagaState, request: StepRequest, event: CallbackAwaited, limit: CommandLimit | None
) -> CallbackReceived:
    """``http_step(completion="callback")``: the request (a step, owed once its service
    accepted it), then the wait for the service's call (``event``, recorded first). A
    request that fails, or is given up, closes the wait; the code giving the step up
    while it waits for the call gives up an applied step (``_undo.give_up_applied``:
    recorded, and its compensation issued at once), as a Kafka step in flight is."""
    try:
        await step(s, request, limit)
    except BaseException:
        close_wait(s, event.wait_id)
        raise
    try:
        return await wait_callback(s, event)
    except asyncio.CancelledError as cancelled:
        give_up_applied(s, request.name, cancelled)
        raise


def _received(s: SagaState, wait_id: str) -> CallbackReceived | None:
    return next(
        (e for e in s.history if isinstance(e, CallbackReceived) and e.wait_id == wait_id),
        None,
    )


def _answer(event: CallbackAwaited, received: CallbackReceived) -> CallbackReceived:
    if received.failed:
        error = received.payload.get("error")
        raise CallbackFailed(
            event.name,
            error if isinstance(error, str) and error else "no reason given",
            {k: v for k, v in received.payload.items() if k != "error"},
        )
    return received


def callback_event(s: SagaState, inbound: CallbackInput) -> Event | DropReason:
    """The event that records a callback, or the drop of a repeat; raises CallbackConflict
    for another body after the first, CallbackGone when the wait is over, InvalidPayload
    (naming each field) when its model refuses the body. Nothing is recorded but the first
    accepted answer."""
    repeat = repeated_callback(s, inbound)
    if repeat is not None:
        return repeat
    wait = s.callback_waits.get(inbound.wait_id)
    if wait is None or not s.going_forward or s.cancel_reason is not None:
        raise CallbackGone(
            f"saga {s.saga_id} no longer waits for callback {inbound.wait_id!r} (it timed "
            f"out, was given up, or the saga is {s.status.value}); nothing was recorded"
        )
    if not inbound.failed and wait.model is not None:
        validate_payload(wait.model, inbound.payload, f"callback {wait.event.name!r}")
    check_storable(inbound.payload, f"callback {wait.event.name!r}", "payload")
    return CallbackReceived(
        at=inbound.at,
        wait_id=inbound.wait_id,
        payload=inbound.payload,
        failed=inbound.failed,
        digest=inbound.digest,
    )


def repeated_callback(s: SagaState, inbound: CallbackInput) -> DropReason | None:
    """A repeat of the recorded answer is dropped (its caller gets the same answer);
    another body after it is a conflict; None: no answer recorded yet."""
    digest = s.callbacks_received.get(inbound.wait_id)
    if digest is None:
        return None
    if digest != inbound.digest:
        raise CallbackConflict(
            f"callback {inbound.wait_id!r} of saga {s.saga_id} was answered already with "
            "another body; the first answer stands and nothing was recorded"
        )
    return DropReason.DUPLICATE_CALLBACK


def after_the_end(s: SagaState, inbound: CallbackInput) -> DropReason:
    """A callback to a saga that ended: the drop of a repeat, else CallbackGone."""
    repeat = repeated_callback(s, inbound)
    if repeat is None:
        raise CallbackGone(
            f"saga {s.saga_id} is {s.status.value}; it waits for no callback any more "
            "and nothing was recorded"
        )
    return repeat


def callback_to_code(s: SagaState, event: CallbackReceived, settled: Settled) -> None:
    if not isinstance(settled, CallbackWait):
        s.nondeterministic(
            s.cursor - 1, event.describe(), f"no wait for it ({s.describe_waiting()})"
        )
        raise Halt
    if settled.future is not None and not settled.future.done():
        settled.future.set_result(event)


def parsed(model: type[Any] | None, received: CallbackReceived, name: str) -> Any:
    """The body as the code reads it: its model's instance, or the JSON object."""
    if model is None:
        return dict(received.payload)
    return validate_payload(model, received.payload, f"callback {name!r}")

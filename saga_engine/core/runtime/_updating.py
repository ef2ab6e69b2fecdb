"""An update's way into a saga: checked into its event, then its handler run and its
result recorded (the ``_inputs`` rules for the ``UpdateInput`` input).

Checked before anything is recorded: the update id already recorded (dropped: its
recorded result is the answer), a saga that is undoing its steps (refused), the update's
name and input model, then its validator on the saga's state (refused with its reason).
Once ``update_received`` is recorded (or replayed), :func:`update_to_code` runs the handler
on the saga object and records its result (``update_completed``, an intent: a replay
runs the handler again and matches it), then wakes the code's ``ctx.wait_update`` for
it, if the handler did not raise (:func:`wait_update`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from saga_engine.core.authoring._update import as_json, declared, updates_of
from saga_engine.core.history._decision import DropReason, UpdateInput
from saga_engine.core.history._events import ErrorInfo, Event, UpdateCompleted, UpdateReceived
from saga_engine.core.runtime._intents import check_open, emit
from saga_engine.core.runtime._state import Halt, SagaState
from saga_engine.kernel._errors import SagaError, UpdateRefused
from saga_engine.kernel._serde import check_storable


def recorded_answer(events: Iterable[Event], update_id: str) -> UpdateCompleted | None:
    """The recorded result of the update ``update_id``, if it has one."""
    return next(
        (e for e in events if isinstance(e, UpdateCompleted) and e.update_id == update_id), None
    )


def update_event(s: SagaState, inbound: UpdateInput) -> Event | DropReason:
    """The event that records ``inbound``; raises UpdateRefused or InvalidPayload."""
    if any(isinstance(e, UpdateReceived) and e.update_id == inbound.update_id for e in s.history):
        return DropReason.DUPLICATE_UPDATE
    if not s.going_forward or s.cancel_reason is not None:
        raise UpdateRefused(
            f"saga {s.saga_id} is {s.status.value}: it is undoing its steps, so it takes no update"
        )
    handler = declared(s.definition.cls, "update", inbound.name)
    value = handler.parse(inbound.payload, "payload")
    check_storable(
        {"update_id": inbound.update_id, "principal": inbound.principal, "reason": inbound.reason},
        f"update {inbound.name!r}",
    )
    if s.saga is None:
        raise UpdateRefused(f"saga {s.saga_id}: its code has not started yet")
    try:
        refusal = handler.refusal(s.saga, value)  # type: ignore[attr-defined]
    except SagaError:
        raise
    except Exception as exc:
        refusal = f"its validator raised {type(exc).__name__}: {exc}"
    if refusal is not None:
        raise UpdateRefused(f"update {inbound.name!r} refused: {refusal}")
    return UpdateReceived(
        at=inbound.at,
        update_id=inbound.update_id,
        name=inbound.name,
        payload=inbound.payload,
        principal=inbound.principal,
        reason=inbound.reason,
    )


def update_to_code(s: SagaState, event: UpdateReceived, settled: Any) -> None:
    """Runs the update's handler on the saga's state and records what it returned (or
    raised). Parks the saga if the code deployed no longer takes the recorded update."""
    handler = updates_of(s.definition.cls).get(event.name)
    try:
        if handler is None:
            raise UpdateRefused(f"the code deployed declares no update {event.name!r}")
        value = handler.parse(event.payload, "payload")
    except SagaError as exc:
        s.nondeterministic(s.cursor - 1, event.describe(), str(exc))
        raise Halt from None
    result: Any = None
    error: ErrorInfo | None = None
    try:
        result = as_json(handler.call(s.saga, value), f"update {event.name!r}")
    except Exception as exc:
        error = ErrorInfo(type=type(exc).__name__, message=str(exc))
    emit(
        s,
        UpdateCompleted(
            at=s.now, update_id=event.update_id, name=event.name, result=result, error=error
        ),
    )
    waiter = s.update_waiters.get(event.name) if s.update_waiters else None
    if error is None and waiter is not None and not waiter.done():
        waiter.set_result(value)


async def wait_update(s: SagaState, name: str) -> Any:
    """``ctx.wait_update``: the input of the next update ``name`` recorded from now on
    whose handler did not raise (its effect is on the saga's state by then). Nothing is
    recorded for the wait: an update is an input, delivered again on replay."""
    check_open(s)
    if name not in updates_of(s.definition.cls):
        s.definition_error(
            f"{s.definition.cls.__name__} waits for update {name!r} but declares no such "
            "@update method; declare it, deploy, and resume the saga"
        )
    if s.update_waiters is None:
        s.update_waiters = {}
    if name in s.update_waiters:
        s.definition_error(f"two waits for update {name!r} at once; wait for it in one place")
    future: asyncio.Future[Any] = s.loop.create_future()
    s.update_waiters[name] = future
    try:
        return await future
    finally:
        s.update_waiters.pop(name, None)

"""``ctx.wait_event``: the saga's code waits for another service's domain event.

The wait is an intent (``event_awaited``: the source, the correlation key, the timeout),
so it is in history before anything can answer it: the runner reads the open waits from
there, looks for a stored fact that matches after the write commits, and offers it as an
input (``domain_event_received``). A timeout is a timer named after the wait.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from saga_engine.core.history._events import EventAwaited
from saga_engine.core.runtime._intents import check_open, emit, end_with_timer, next_id
from saga_engine.core.runtime._state import SagaState
from saga_engine.kernel._errors import EventTimeout
from saga_engine.kernel._serde import JsonDict


async def wait_event(s: SagaState, source: str, key: str, limit: timedelta | None) -> JsonDict:
    """The payload of the first fact of ``source`` with ``key`` offered after this wait
    is recorded (one kept from before it included); EventTimeout when ``limit`` (the timeout) passes."""
    check_open(s)
    wait_id = f"event:{source}:{next_id(s, 'event:' + source)}"
    emit(
        s,
        EventAwaited(
            at=s.now,
            wait_id=wait_id,
            source=source,
            key=key,
            timeout_at=s.now + limit if limit is not None else None,
        ),
    )
    future: asyncio.Future[Any] = s.loop.create_future()
    s.event_waits[wait_id].future = future
    end_with_timer(s, wait_id, future)
    try:
        payload: JsonDict | None = await future
    finally:
        # Answered, timed out, or given up by the code (its task cancelled).
        s.event_waits.pop(wait_id, None)
        s.timers.pop(wait_id, None)
    if payload is None:
        raise EventTimeout(source, key)
    return payload

"""``GET /sagas/{saga_id}/stream``: a saga's progress items (``ctx.emit``) as
server-sent events, as they are committed.

Built on the store: the route polls the saga's record (one row) at a bounded interval and
reads the items past the last one sent only when the record moved. Each item is one
``message`` event whose ``id`` is the item's number, so a reader that reconnects with
``Last-Event-ID`` (a browser's ``EventSource`` does it by itself) gets every later item
once: no gap, no duplicate. Once the saga ended and its last item was sent, an ``end``
event says how it ended and the response closes. A comment line keeps an idle connection
alive; a connection is closed after ``LIFETIME_S`` without ``end`` (a reader reconnects).

No ``from __future__ import annotations``: FastAPI reads the endpoint's annotations at
runtime.
"""

import asyncio
import time
from collections.abc import AsyncIterator, Collection
from typing import Annotated, Final

from fastapi import APIRouter, Header, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse

from saga_engine.admin._deps import PartsDep
from saga_engine.admin._route_helpers import READ_ERRORS, SagaIdPath, errors, saga_ref
from saga_engine.core.history._codec import Undecodable
from saga_engine.core.runtime._progress import check_topic
from saga_engine.kernel._serde import dumps
from saga_engine.store._progress import progress_after
from saga_engine.store._store import EventStore

__all__ = ["StreamTiming", "router", "sse_frames"]

router = APIRouter()

#: One server-sent event of the stream, as its fields (``data`` is JSON).
_EVENT_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "The item's number."},
        "event": {"type": "string", "enum": ["message", "end"]},
        "data": {"type": "string", "description": "JSON: {number, topic, payload, at}"},
    },
    "required": ["data"],
}

#: At most this many topics in one ``?topics=``.
_MAX_TOPICS: Final = 20


class StreamTiming:
    """The stream's bounds (seconds): the poll interval grows from ``poll_min`` to
    ``poll_max`` while nothing happens; a comment every ``keepalive``; a connection
    lasts at most ``lifetime``."""

    poll_min: float = 0.05
    poll_max: float = 1.0
    keepalive: float = 15.0
    lifetime: float = 300.0


def _topics(raw: list[str] | None) -> frozenset[str] | None:
    if not raw:
        return None
    names = [name.strip() for value in raw for name in value.split(",") if name.strip()]
    problems = [
        {"loc": ["query", "topics"], "msg": problem, "type": "topic"}
        for problem in (check_topic(name) for name in names)
        if problem is not None
    ]
    if len(names) > _MAX_TOPICS:
        msg = f"at most {_MAX_TOPICS} topics, got {len(names)}"
        problems.append({"loc": ["query", "topics"], "msg": msg, "type": "too_many"})
    if problems:
        raise RequestValidationError(problems)
    return frozenset(names) if names else None


def _resume_point(after: int, last_event_id: str | None) -> int:
    """Where to resume: ``Last-Event-ID`` (a reconnection) wins over ``after``."""
    if last_event_id is None or not last_event_id.strip():
        return after
    text = last_event_id.strip()
    if not text.isdigit() or len(text) > 12:
        msg = f"Last-Event-ID must be an item number (an integer >= 0), got {text[:40]!r}"
        raise RequestValidationError(
            [{"loc": ["header", "last-event-id"], "msg": msg, "type": "int_parsing"}]
        )
    return int(text)


async def sse_frames(
    store: EventStore,
    saga_id: str,
    after: int,
    topics: Collection[str] | None,
    follow: bool = True,
) -> AsyncIterator[bytes]:
    """The stream's frames: items after ``after``, then ``end`` once the saga ended (with
    ``follow=False``, the items there are now, and ``end`` only if it ended)."""
    sent, seen_seq = after, -1
    started = last_write = time.monotonic()
    poll = StreamTiming.poll_min
    while True:
        record = await store.get(saga_id)
        if record.last_seq != seen_seq:
            page = await progress_after(
                store, saga_id, sent, topics, Undecodable.SHOW, after_seq=max(seen_seq, 0)
            )
            seen_seq, poll = page.last_seq, StreamTiming.poll_min
            for item in page.items:
                yield b"id: %d\ndata: %s\n\n" % (item.number, dumps(item.as_json()))
                sent, last_write = item.number, time.monotonic()
            if page.status.is_terminal:
                end = {"status": page.status.value, "last_number": sent}
                yield b"event: end\ndata: %s\n\n" % dumps(end)
                return
        now = time.monotonic()
        if not follow or now - started >= StreamTiming.lifetime:
            return
        if now - last_write >= StreamTiming.keepalive:
            yield b": keep-alive\n\n"
            last_write = now
        await asyncio.sleep(poll)
        poll = min(poll * 2, StreamTiming.poll_max)


@router.get(
    "/sagas/{saga_id}/stream",
    name="stream_progress",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {"schema": _EVENT_SCHEMA}},
            "description": "Server-sent events: one per progress item (`id`: its number, "
            "`data`: {number, topic, payload, at}), then `end` ({status, last_number}) "
            "once the saga ended.",
        },
        **errors(404, *READ_ERRORS),
    },
)
async def stream_progress(
    saga_id: SagaIdPath,
    parts: PartsDep,
    topics: Annotated[
        list[str] | None,
        Query(description="Only these topics: repeat, or separate with commas."),
    ] = None,
    after: Annotated[int, Query(ge=0, description="Send the items numbered above this one.")] = 0,
    follow: Annotated[
        bool, Query(description="false: the items there are now, then close.")
    ] = True,
    last_event_id: Annotated[
        str | None,
        Header(description="The last item's number seen: resume after it (wins over after)."),
    ] = None,
) -> StreamingResponse:
    """A saga's progress items (``ctx.emit``) as server-sent events, live: from the one
    after ``Last-Event-ID`` (or ``after``), with no gap and no duplicate, until the saga
    ends. See docs/progress.md."""
    wanted = _topics(topics)
    start = _resume_point(after, last_event_id)
    await parts.store.get(saga_ref(saga_id))  # an unknown saga is a 404 now, not mid-stream
    return StreamingResponse(
        sse_frames(parts.store, saga_id, start, wanted, follow),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )

"""``GET /sagas/{saga_id}/stream``: a saga's progress items (``ctx.emit``) as
server-sent events, as they are committed.

Built on the store: the route polls the saga's record (one row) at a bounded interval and
reads the items past the last one sent only when the record moved. Each item is one
``message`` event whose ``id`` is the item's number, so a reader that reconnects with
``Last-Event-ID`` (a browser's ``EventSource`` does it by itself) gets every later item
once: no gap, no duplicate. Once the saga ended and its last item was sent, an ``end``
event says how it ended and the response closes. A comment line keeps an idle connection
alive; a connection is closed after ``LIFETIME_S`` without ``end`` (a reader reconnects).

With ``?steps=true`` the stream also carries participants' reports on the commands in
flight (``tx.progress``, from the process's ``StepProgressBoard``) as ``step_progress``
events with no ``id``: they are not numbered, so ``Last-Event-ID`` stays the last item's
and resuming is unchanged; a command's reports stop once its reply is in the history,
and a ``step_ended`` event (no ``id`` either) says so for a command whose reports were
sent. A process serves at most ``admin.max_streams`` streams at once: one more is a 503 with
``Retry-After``.

No ``from __future__ import annotations``: FastAPI reads the endpoint's annotations at
runtime.
"""

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Collection
from typing import Annotated, Final

from fastapi import APIRouter, Header, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from saga_engine.admin._deps import PartsDep, StepBoardDep, StreamSlots, StreamSlotsDep
from saga_engine.admin._http_errors import RETRY_AFTER_S
from saga_engine.admin._route_helpers import READ_ERRORS, SagaIdPath, errors, saga_ref
from saga_engine.admin._step_board import StepProgressBoard
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
        "event": {
            "type": "string",
            "enum": ["message", "end", "step_progress", "step_ended"],
        },
        "data": {
            "type": "string",
            "description": "JSON: message {number, topic, payload, at}; end {status, "
            "last_number}; step_progress {command_id, step, attempt, seq, at, body}; "
            "step_ended {command_id}",
        },
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


class _StepMarks:
    """What a stream sent of participants' step reports: the board's serial of the last
    one, the commands it sent reports of, and the commands that ended (their reports
    are sent no more)."""

    def __init__(self, board: StepProgressBoard | None, saga_id: str) -> None:
        self.board, self.saga_id = board, saga_id
        self.last = 0
        self.reported: set[str] = set()
        self.ended: set[str] = set()

    def frames(self) -> list[bytes]:
        """``step_progress`` for each report not sent yet, and ``step_ended`` for each
        command reported on that ended since."""
        if self.board is None:
            return []
        out = []
        for command_id in sorted(self.reported & self.ended):
            out.append(b"event: step_ended\ndata: %s\n\n" % dumps({"command_id": command_id}))
            self.reported.discard(command_id)
        for report in self.board.reports(self.saga_id):
            if report.serial > self.last and report.command_id not in self.ended:
                self.reported.add(report.command_id)
                out.append(b"event: step_progress\ndata: %s\n\n" % dumps(report.as_json()))
        self.last = self.board.serial
        return out

    def end(self, command_ids: frozenset[str]) -> None:
        """These commands ended (their reply is in the history): no more reports."""
        fresh = command_ids - self.ended
        self.ended |= fresh
        if self.board is not None and fresh:
            self.board.drop(self.saga_id, fresh)

    def forget(self) -> None:
        """The saga ended: none of its commands runs."""
        if self.board is not None:
            self.board.retain(self.saga_id, ())

    async def wait(self, seconds: float) -> None:
        if self.board is None:
            await asyncio.sleep(seconds)
        else:
            await self.board.changed(self.saga_id, seconds)


async def sse_frames(
    store: EventStore,
    saga_id: str,
    after: int,
    topics: Collection[str] | None,
    follow: bool = True,
    steps: StepProgressBoard | None = None,
) -> AsyncGenerator[bytes]:
    """The stream's frames: items after ``after``, then ``end`` once the saga ended (with
    ``follow=False``, the items there are now, and ``end`` only if it ended). With
    ``steps``, participants' reports on the commands in flight too, as ``step_progress``
    events without an ``id`` (a reader's ``Last-Event-ID`` stays the last item's)."""
    sent, seen_seq = after, -1
    marks = _StepMarks(steps, saga_id)
    started = last_write = next_read = time.monotonic()
    poll = StreamTiming.poll_min
    while True:
        if time.monotonic() >= next_read:
            record = await store.get(saga_id)
            if record.last_seq != seen_seq:
                page = await progress_after(
                    store,
                    saga_id,
                    sent,
                    topics,
                    Undecodable.SHOW,
                    after_seq=max(seen_seq, 0),
                    # With steps: the replies too (the first page reads them from the
                    # start, as the saga's page does, once per connection).
                    ended=steps is not None,
                )
                seen_seq, poll = page.last_seq, StreamTiming.poll_min
                marks.end(page.ended_commands)
                for item in page.items:
                    yield b"id: %d\ndata: %s\n\n" % (item.number, dumps(item.as_json()))
                    sent, last_write = item.number, time.monotonic()
                if page.status.is_terminal:
                    marks.forget()
                    end = {"status": page.status.value, "last_number": sent}
                    yield b"event: end\ndata: %s\n\n" % dumps(end)
                    return
            next_read = time.monotonic() + poll
            poll = min(poll * 2, StreamTiming.poll_max)
        for frame in marks.frames():
            yield frame
            last_write = time.monotonic()
        now = time.monotonic()
        if not follow or now - started >= StreamTiming.lifetime:
            return
        if now - last_write >= StreamTiming.keepalive:
            yield b": keep-alive\n\n"
            last_write = now
        await marks.wait(max(0.0, next_read - time.monotonic()))


class _CountedStream(StreamingResponse):
    """A stream that gives its slot back however it ends (done, dropped, cancelled)."""

    def __init__(self, content: AsyncIterator[bytes], slots: StreamSlots) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._slots = slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slots.give()


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
        503: {
            "description": "admin.max_streams streams are open in this process: connect "
            "again after Retry-After seconds (SagaClient.stream does)."
        },
        **errors(404, *READ_ERRORS),
    },
)
async def stream_progress(
    saga_id: SagaIdPath,
    parts: PartsDep,
    board: StepBoardDep,
    slots: StreamSlotsDep,
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
    steps: Annotated[
        bool,
        Query(
            description="true: also the participants' reports on the commands in flight "
            "(tx.progress), as step_progress events without an id."
        ),
    ] = False,
) -> Response:
    """A saga's progress items (``ctx.emit``) as server-sent events, live: from the one
    after ``Last-Event-ID`` (or ``after``), with no gap and no duplicate, until the saga
    ends. See docs/progress.md."""
    wanted = _topics(topics)
    start = _resume_point(after, last_event_id)
    await parts.store.get(saga_ref(saga_id))  # an unknown saga is a 404 now, not mid-stream
    if not slots.take():
        detail = (
            f"this engine serves at most {slots.limit} progress streams at once "
            f"(admin.max_streams); connect again after Retry-After seconds, or to another engine"
        )
        return JSONResponse(
            {"detail": detail, "error": "TooManyStreams"},
            status_code=503,
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    frames = sse_frames(parts.store, saga_id, start, wanted, follow, board if steps else None)
    return _CountedStream(frames, slots)

"""``SagaClient.stream``: a saga's progress items, read from the admin API's stream of
server-sent events (``GET /sagas/{id}/stream``).

The iterator remembers the number of the last item it yielded; when the connection
drops (the engine restarted, a proxy timed out, the server closed a long connection),
it reconnects with ``Last-Event-ID`` set to that number, so it yields every item once, in
order, until the saga's ``end``. It gives up only on an answer no retry can change (404:
no such saga; 401/403; 422) or after ``max_reconnects`` attempts in a row that got
nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final
from urllib.parse import quote

import httpx

from saga_engine.client._calls import error_of
from saga_engine.kernel._errors import TransientError
from saga_engine.kernel._serde import loads
from saga_engine.store._progress import ProgressItem

#: How long a read may wait for a byte: above the server's keep-alive (15 s).
_READ_TIMEOUT_S: Final = 60.0


@dataclass
class _Frame:
    """One server-sent event being read: its ``event``, ``id`` and ``data`` lines."""

    event: str = "message"
    id: str | None = None
    data: list[str] = field(default_factory=list)


def _frames(lines: list[str]) -> tuple[list[_Frame], list[str]]:
    """The complete frames in ``lines`` and the lines of the frame still open."""
    frames, current = [], _Frame()
    rest: list[str] = []
    for line in lines:
        rest.append(line)
        if line == "":
            if current.data or current.event != "message":
                frames.append(current)
            current, rest = _Frame(), []
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                current.data.append(value)
            elif name == "id":
                current.id = value
            elif name == "event":
                current.event = value
    return frames, rest


def _item(frame: _Frame) -> ProgressItem:
    data: dict[str, Any] = loads("\n".join(frame.data))
    return ProgressItem(
        int(data["number"]), data["topic"], data.get("payload"), datetime.fromisoformat(data["at"])
    )


async def stream_items(
    url: str,
    token: str | None,
    saga_id: str,
    *,
    after: int = 0,
    topics: Collection[str] | None = None,
    reconnect_delay: float = 0.5,
    max_reconnects: int = 20,
) -> AsyncIterator[ProgressItem]:
    """The saga's progress items after ``after``, until it ends; reconnects and resumes
    after the last item yielded when a connection drops."""
    path = f"{url.rstrip('/')}/sagas/{quote(saga_id, safe='')}/stream"
    params = {"topics": ",".join(topics)} if topics else {}
    last, failures = after, 0
    timeout = httpx.Timeout(10.0, read=_READ_TIMEOUT_S)
    async with httpx.AsyncClient(timeout=timeout) as http:
        while True:
            headers = {"Last-Event-ID": str(last)}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                async with http.stream("GET", path, params=params, headers=headers) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        raise error_of(response, saga_id, "the progress stream")
                    pending: list[str] = []
                    async for line in response.aiter_lines():
                        frames, pending = _frames([*pending, line.rstrip("\r")])
                        for frame in frames:
                            if frame.event == "end":
                                return
                            if frame.event != "message":
                                continue  # an event type this client does not know
                            item = _item(frame)
                            if item.number > last:
                                last, failures = item.number, 0
                                yield item
            except (httpx.TransportError, TransientError) as exc:
                failures += 1
                if failures > max_reconnects:
                    raise TransientError(
                        f"the progress stream of saga {saga_id} at {url} dropped "
                        f"{failures} times in a row ({exc}); call stream(after={last}) again"
                    ) from exc
            await asyncio.sleep(min(reconnect_delay * failures, 5.0))

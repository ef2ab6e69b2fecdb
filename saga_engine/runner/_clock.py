"""Time for the runner: a real clock for engines, a virtual one for the testing kit.

The decision core never reads a clock; the runner stamps each input with ``now()``
and asks the clock to call it back when the saga's next timer is due.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

from saga_engine.telemetry._telemetry import detach_from_trace

Callback = Callable[[], Awaitable[None]]


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> datetime: ...

    def monotonic(self) -> float:
        """Seconds that never go back, for intervals (flow control's token buckets and
        latencies): the process's monotonic clock, or virtual time."""
        ...

    def call_at(self, when: datetime, callback: Callback) -> TimerHandle:
        """Runs ``callback`` (a coroutine function) at ``when`` or as soon as possible after."""
        ...


class SystemClock:
    """Wall-clock time; callbacks run as tasks on the running loop."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def call_at(self, when: datetime, callback: Callback) -> TimerHandle:
        loop = asyncio.get_running_loop()
        delay = max(0.0, (when - self.now()).total_seconds())
        return loop.call_later(delay, self._spawn, callback)

    def _spawn(self, callback: Callback) -> None:
        task = asyncio.get_running_loop().create_task(self._run(callback))
        # Keep a reference: the loop only holds weak ones to tasks.
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _run(callback: Callback) -> None:
        # A timer's work belongs to no trace of whoever armed it (an admin request, say).
        detach_from_trace()
        await callback()


class _VirtualHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """Time that only moves when told to; due callbacks run in order of due time."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2030, 1, 1, tzinfo=UTC)
        self._heap: list[tuple[datetime, int, _VirtualHandle, Callback]] = []
        self._seq = itertools.count()

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        """Virtual seconds: an interval is as long as the time the test moved on, so
        what flow control measures (a reply's latency, a bucket's refill) does not
        depend on how fast the machine runs the test."""
        return self._now.timestamp()

    def call_at(self, when: datetime, callback: Callback) -> TimerHandle:
        handle = _VirtualHandle()
        heapq.heappush(self._heap, (when, next(self._seq), handle, callback))
        if len(self._heap) > 1024 and len(self._heap) & 1023 == 0:
            # Cancelled timers (of sagas that moved on or were evicted) would otherwise
            # stay until their due time: drop them now and then, as asyncio does.
            self._heap = [entry for entry in self._heap if not entry[2].cancelled]
            heapq.heapify(self._heap)
        return handle

    def next_due(self) -> datetime | None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    async def advance(self, delta: timedelta, settle: Callable[[], Awaitable[None]]) -> None:
        """Moves time forward by ``delta``, running each due callback at its due time."""
        target = self._now + delta
        while True:
            due = self.next_due()
            if due is None or due > target:
                break
            when, _, handle, callback = heapq.heappop(self._heap)
            self._now = max(self._now, when)
            if not handle.cancelled:
                await callback()
                await settle()
        self._now = target

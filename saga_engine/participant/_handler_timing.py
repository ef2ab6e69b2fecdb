"""When a handler ran and the CPU time it used, for the reply's timing headers
(PROTOCOL.md 7.4a), and the headers a reply gets after its transaction committed.

The CPU time is the handler's own: :class:`CpuTimed` drives the handler's coroutine and
adds up the thread's CPU time of each of its steps (from one resumption to its next
suspension), so the time other tasks run while it awaits its database is not counted.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Generator
from typing import Any, Generic, TypeVar

from saga_engine.participant._reading import Item
from saga_engine.transport._timings import reply_timing_headers

T = TypeVar("T")


class CpuTimed(Generic[T]):
    """Awaits ``awaitable`` (a handler's coroutine) as it is, measuring the wall-clock
    span and the CPU time of its own steps (``started``, ``ended``: seconds since the
    epoch; ``cpu_s``)."""

    __slots__ = ("_awaitable", "cpu_s", "ended", "started")

    def __init__(self, awaitable: Awaitable[T]) -> None:
        self._awaitable = awaitable
        self.cpu_s = 0.0
        self.started = 0.0
        self.ended = 0.0

    def __await__(self) -> Generator[Any, Any, T]:
        coro, cpu = self._awaitable.__await__(), time.thread_time
        self.started = time.time()
        sent: Any = None
        thrown: BaseException | None = None
        try:
            while True:
                before = cpu()
                try:
                    step = coro.send(sent) if thrown is None else coro.throw(thrown)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                finally:
                    self.cpu_s += cpu() - before
                sent, thrown = None, None
                try:
                    sent = yield step
                except GeneratorExit:
                    coro.close()
                    raise
                except BaseException as exc:  # a cancellation, thrown into the handler
                    thrown = exc
        finally:
            self.ended = time.time()


def record_handler_times(items: list[Item], timed: CpuTimed[Any]) -> None:
    """The handler call's times on each of its items: a batch handler's call is shared,
    each of its commands reporting the call's span and an equal share of its CPU time."""
    share = timed.cpu_s / len(items)
    for item in items:
        item.handler_times = (timed.started, timed.ended, share)


def stamp_timings(item: Item, committed: float) -> None:
    """Adds the timing headers to ``item``'s reply, once its transaction committed
    (``ce_senttime`` is echoed from the command when the reply is made): when the
    command was read and committed and, if its handler ran in the pass that committed,
    when it started and ended and its CPU time."""
    outgoing = item.outgoing
    if outgoing is None:
        return
    handler = item.handler_times
    if item.duplicate or item.same_as is not None:
        handler = None
    outgoing.headers.extend(reply_timing_headers(item.received, committed, handler))

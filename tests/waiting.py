"""Waiting in tests: the one way a test waits for something another task, process or
server does. ``await eventually(probe, what=...)`` polls ``probe`` until it returns
something truthy and returns that; at the deadline it fails naming what it waited for
and the last value it saw. A test never sleeps instead of waiting on the event.

Deadlines are generous, because a busy machine (a CI runner, two cores shared with other
work) can be many times slower than a developer's: they bound a wait that ends much
sooner when things work. ``SAGA_TEST_TIME_SCALE`` (default 1) multiplies every deadline
given here, and the per-test timeouts marked with :func:`scaled`, for a machine slower
still: ``SAGA_TEST_TIME_SCALE=3 make test``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import reprlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

__all__ = ["DEFAULT_TIMEOUT_S", "TIME_SCALE", "eventually", "eventually_sync", "scaled"]

T = TypeVar("T")


def _time_scale() -> float:
    raw = os.environ.get("SAGA_TEST_TIME_SCALE", "1")
    try:
        scale = float(raw)
    except ValueError:
        scale = 0.0
    if not scale >= 1:
        raise ValueError(
            f"SAGA_TEST_TIME_SCALE={raw!r}: give a number >= 1, the factor by which this "
            "machine is slower than the deadlines assume (1 unless the machine is very busy)"
        )
    return scale


#: How much slower than usual the machine may be: multiplies every test deadline.
TIME_SCALE = _time_scale()
#: The deadline of a wait that gives none (before scaling).
DEFAULT_TIMEOUT_S = 30.0


def scaled(seconds: float) -> float:
    """``seconds`` stretched by ``SAGA_TEST_TIME_SCALE``: for a wait's deadline or a
    ``pytest.mark.timeout``."""
    return seconds * TIME_SCALE


def _describe(probe: Callable[..., Any]) -> str:
    """What a probe waits for when the caller did not say: a lambda's source line, or
    the function's name."""
    if getattr(probe, "__name__", "") == "<lambda>":
        try:
            return inspect.getsource(probe).strip()
        except (OSError, TypeError):
            pass
    return getattr(probe, "__qualname__", repr(probe))


def _failure(
    what: str, seconds: float, last: object, context: Callable[[], str] | None
) -> AssertionError:
    message = f"waited {seconds:.0f}s for {what}; last seen: {reprlib.repr(last)}"
    return AssertionError(f"{message}\n{context()}" if context is not None else message)


@overload
async def eventually(
    probe: Callable[[], Awaitable[T | None]],
    *,
    what: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.05,
    context: Callable[[], str] | None = None,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], Awaitable[T]],
    *,
    what: str | None = None,
    until: Callable[[T], object],
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.05,
    context: Callable[[], str] | None = None,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], T | None],
    *,
    what: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.05,
    context: Callable[[], str] | None = None,
) -> T: ...


@overload
async def eventually(
    probe: Callable[[], T],
    *,
    what: str | None = None,
    until: Callable[[T], object],
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.05,
    context: Callable[[], str] | None = None,
) -> T: ...


async def eventually(
    probe: Callable[[], Any],
    *,
    what: str | None = None,
    until: Callable[[Any], object] = bool,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.05,
    context: Callable[[], str] | None = None,
) -> Any:
    """Calls ``probe`` (sync or async) every ``interval`` seconds until ``until`` holds
    for its value (by default: until it is truthy) and returns that value. Fails with an
    ``AssertionError`` naming ``what`` and the last value once ``timeout`` seconds
    (scaled by ``SAGA_TEST_TIME_SCALE``) have passed, followed by what ``context``
    returns then (a process's log, say)."""
    seconds = scaled(timeout)
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if until(value):
            return value
        if time.monotonic() > deadline:
            raise _failure(what or _describe(probe), seconds, value, context)
        await asyncio.sleep(interval)


def eventually_sync(
    probe: Callable[[], T],
    *,
    what: str | None = None,
    until: Callable[[T], object] = bool,
    timeout: float = DEFAULT_TIMEOUT_S,
    interval: float = 0.05,
    context: Callable[[], str] | None = None,
) -> T:
    """:func:`eventually` for a test that is not async (it blocks its thread)."""
    seconds = scaled(timeout)
    deadline = time.monotonic() + seconds
    while True:
        value = probe()
        if until(value):
            return value
        if time.monotonic() > deadline:
            raise _failure(what or _describe(probe), seconds, value, context)
        time.sleep(interval)

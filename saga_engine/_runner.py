"""Running a process's main coroutine, on uvloop when it is installed.

uvloop (the ``saga-engine[fast]`` extra) is a drop-in asyncio event loop on libuv. On the
end-to-end benchmark it gave about 1.1-1.2x the throughput for 0.9x the CPU per saga
(bench/README.md), so the worker, ``saga worker`` and participant services use it when
it is there, and plain asyncio when it is not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T], *, uvloop: bool | None = None) -> T:
    """Runs ``main`` to completion on a new event loop, like ``asyncio.run``.

    ``uvloop``: None (the default) uses uvloop when it is installed; True requires it;
    False uses asyncio's own loop.
    """
    factory = _uvloop_factory() if uvloop is not False else None
    if uvloop and factory is None:
        main.close()
        raise RuntimeError("uvloop is not installed: pip install 'saga-engine[fast]'")
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)

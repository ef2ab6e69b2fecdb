"""Running a process's main coroutine, on uvloop when it is installed.

It also tunes the garbage collector for a long-running service (see ``run``).

uvloop (the ``saga-engine[fast]`` extra) is a drop-in asyncio event loop on libuv. On the
end-to-end benchmark, paired runs gave 1.0-1.3x the throughput for 0.85-0.95x the CPU
per saga (bench/README.md), so the worker, ``saga worker`` and participant services use
it when it is there, and plain asyncio when it is not.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


#: CPython's collector thresholds for a service (its defaults are 700, 10, 10): a young
#: collection every 50,000 net allocations, an older one every 20 of those, and a full
#: one at most every 100 older ones (and, as always, only once a quarter of the
#: long-lived objects are new).
GC_THRESHOLDS = (50_000, 20, 100)


def run(main: Coroutine[Any, Any, T], *, uvloop: bool | None = None, tune_gc: bool = True) -> T:
    """Runs ``main`` to completion on a new event loop, like ``asyncio.run``.

    ``uvloop``: None (the default) uses uvloop when it is installed; True requires it;
    False uses asyncio's own loop.

    ``tune_gc`` (the default) sets the process up for a long-running service: what is
    loaded so far (modules, saga definitions) is moved out of the collector's way
    (``gc.freeze``), and young collections run every 50,000 allocations instead of 700.
    An engine holds every open saga's coroutines, futures and events, and CPython's
    cyclic collector kept walking them: at 512 sagas in flight it cost the engine about
    40 % of its CPU, and the tuned process does about 1.3x the sagas per second
    (bench/README.md). Memory is still reclaimed; garbage cycles just live a little
    longer.
    """
    factory = _uvloop_factory() if uvloop is not False else None
    if uvloop and factory is None:
        main.close()
        raise RuntimeError("uvloop is not installed: pip install 'saga-engine[fast]'")
    if tune_gc:
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)

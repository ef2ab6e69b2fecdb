"""A deterministic event loop that a saga's code runs on.

The saga's ``run`` coroutine (and the engine's lifecycle code around it) does not run
on the engine's asyncio loop. It runs on this private loop, which the runtime steps
by hand: callbacks run strictly in the order they were scheduled, and only when the
runtime calls :meth:`run_until_quiescent`. There are no clocks and no I/O here, so
the same inputs in the same order always produce the same operations in the same
order. That is what makes replay exact, and ``asyncio.gather`` safe to use.

Anything that would need a real clock (``asyncio.sleep(n)``, ``asyncio.wait_for``,
``asyncio.timeout``, ``asyncio.wait`` with a timeout) fails loudly, naming its durable
replacement: ``ctx.sleep``, ``ctx.timeout`` (a deadline on a block), ``ctx.first`` (a
race, with ``ctx.sleep`` as a racer) and step timeouts. ``asyncio.wait(...,
FIRST_COMPLETED)`` without a timeout needs no clock and works: a loser the code then
cancels is given up as ``ctx.first``'s are, and one still running when ``run`` returns is
given up then.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar, TypeVarTuple, Unpack

from saga_engine.kernel._errors import DefinitionError

_T = TypeVar("_T")
_Ts = TypeVarTuple("_Ts")

_NO_CLOCK = (
    "saga code cannot use the asyncio clock (asyncio.sleep with a delay, asyncio.wait_for, "
    "asyncio.timeout, asyncio.wait with a timeout): it would not survive a crash or a "
    "replay. Use the durable ones: `await ctx.sleep(delay)` to wait, `async with "
    "ctx.timeout(delay):` for a deadline on a block (it raises SagaTimeout), `await "
    "ctx.first(done=..., expired=ctx.sleep(delay))` to race an operation against a timer, "
    "or a step's timeout="
)


#: The name of a saga's tasks (one string for all: see ``create_task``).
_TASK_NAME = "saga"

#: A handle made without asyncio.Handle.__init__ (see ``DeterministicLoop.call_soon``).
_new_handle = object.__new__


class _Callback(asyncio.Handle):
    """A callback of the saga's loop: an ``asyncio.Handle`` whose two slots only a loop
    in debug mode writes (this one never is) are read from the class, not set per
    callback: replay's rebuild 44,680 -> 44,369 instructions per event (callgrind inside
    the replay loop, bench/README.md "Replay cuts, second round")."""

    __slots__ = ()
    _repr = None
    _source_traceback = None


@types.coroutine
def yield_once() -> Generator[None, None, None]:
    """Awaited, lets every callback scheduled so far run first: what ``await
    asyncio.sleep(0)`` does (a bare yield the task answers with one ``call_soon``),
    without ``sleep``'s coroutine and its check of the delay around it."""
    yield


class DeterministicLoop(asyncio.AbstractEventLoop):
    def __init__(self) -> None:
        #: Callbacks to run, in order. None while there are none: an engine holds a loop
        #: per saga in memory, and an empty deque is half a kilobyte.
        #: (Each an ``asyncio.Handle``, typed Any: its private slots are read.)
        self._ready: collections.deque[Any] | None = None
        self._closed = False
        self.tasks: list[asyncio.Task[Any]] = []
        #: What the loop was told to report (None until the first: most loops never are).
        self.errors: list[dict[str, Any]] | None = None

    # -- what Futures and Tasks need -------------------------------------------------

    def call_soon(
        self,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        # asyncio.Handle's own __init__ asks the loop ``get_debug()`` (a call) per
        # callback: every wake-up of the saga's code is one. Its slots are set here.
        # With ``Handle._run`` inlined below: replay's rebuild 52,945 -> 51,237
        # instructions per event, most of the decision core's 882,577 -> 848,580 per
        # saga (callgrind, bench/README.md "Replay cuts"). The slots are asyncio's
        # (3.11-3.13 alike); tests/internal/unit run every callback through here.
        made: Any = _new_handle(_Callback)  # (its private slots: not in typeshed)
        made._callback = callback
        made._args = args
        made._loop = self
        made._context = contextvars.copy_context() if context is None else context
        made._cancelled = False
        if self._ready is None:
            self._ready = collections.deque()
        self._ready.append(made)
        handle: asyncio.Handle = made
        return handle

    def call_soon_threadsafe(
        self,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.Handle:
        return self.call_soon(callback, *args, context=context)

    def create_future(self) -> asyncio.Future[Any]:
        return asyncio.Future(loop=self)

    def create_task(
        self,
        coro: Coroutine[Any, Any, _T] | Generator[Any, None, _T],
        *,
        name: str | None = None,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[_T]:
        # Named: a task without a name gets one of its own ("Task-<n>"), 55 bytes a task.
        task: asyncio.Task[_T] = asyncio.Task(
            coro, loop=self, name=_TASK_NAME if name is None else name, context=context
        )
        # Out of asyncio's registry of all tasks (a weak set, ~0.3 KB a task): a saga's
        # tasks run on this loop only, and asyncio.all_tasks() asks about running loops.
        asyncio.tasks._unregister_task(task)
        self.tasks.append(task)
        return task

    def get_debug(self) -> bool:
        return False

    def is_running(self) -> bool:
        return True

    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self._ready = None

    def call_exception_handler(self, context: dict[str, Any]) -> None:
        # Unretrieved task exceptions and the like: keep them for diagnostics.
        self.default_exception_handler(context)

    def default_exception_handler(self, context: dict[str, Any]) -> None:
        if self.errors is None:
            self.errors = []
        self.errors.append(context)

    # -- no clock ----------------------------------------------------------------------

    def time(self) -> float:
        raise DefinitionError(_NO_CLOCK)

    def call_later(
        self,
        delay: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        raise DefinitionError(_NO_CLOCK)

    def call_at(
        self,
        when: float,
        callback: Callable[[Unpack[_Ts]], object],
        *args: *_Ts,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        raise DefinitionError(_NO_CLOCK)

    # -- stepping ----------------------------------------------------------------------

    def run_until_quiescent(self) -> None:
        """Runs ready callbacks, in order, until none is left (or the loop is discarded
        by one of them: the saga was parked, its code stops where it stands).

        Called from inside the engine's own loop, so the engine's running loop is put
        aside for the duration and restored afterwards.
        """
        outer = asyncio._get_running_loop()
        asyncio._set_running_loop(self)
        try:
            while self._ready and not self._closed:
                handle = self._ready.popleft()
                if not self._ready:
                    self._ready = None  # empty: drop the deque (see __init__)
                if not handle._cancelled:  # (cancelled(), without a call per callback)
                    # Handle._run, without its call: an error goes to the exception
                    # handler as asyncio's would.
                    try:
                        handle._context.run(handle._callback, *handle._args)
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException as exc:
                        self.call_exception_handler(
                            {
                                "message": f"Exception in callback {handle!r}",
                                "exception": exc,
                                "handle": handle,
                            }
                        )
        finally:
            asyncio._set_running_loop(outer)

    def _drain(self, bound: int) -> None:
        """Runs what is ready after ``discard`` cancelled the tasks, quietly; bounded: each
        task ends within a few steps once its coroutine is closed."""
        steps = 0
        outer = asyncio._get_running_loop()
        asyncio._set_running_loop(self)
        try:
            while self._ready and steps < bound:
                handle = self._ready.popleft()
                steps += 1
                if not handle._cancelled:
                    with contextlib.suppress(BaseException):
                        handle._run()
        finally:
            asyncio._set_running_loop(outer)

    def discard(self) -> None:
        """Drops the saga's coroutines and everything pending, quietly, and leaves no
        reference cycle behind (a task waiting on another is in one: the awaited task's
        done-callback holds the waiter), which only a full garbage collection would free.

        Each coroutine is closed first (its finally blocks run, but any operation they
        attempt fails: nothing is recorded or sent); then every task is cancelled and its
        remaining steps run, which only throw into the closed coroutines: each task ends,
        cancelled, and lets go of what it waited on."""
        tasks = list(self.tasks)
        for task in tasks:
            if task.done():
                continue  # (a saga that ended: all of them) nothing to close or cancel
            coro = task.get_coro()
            if coro is not None and hasattr(coro, "close"):
                try:
                    coro.close()
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException:
                    # Closing runs the saga's finally blocks; one that awaits a ctx
                    # operation gets CancelledError (the saga is being dropped). Whatever
                    # they raise, the saga is gone: it must not stop whoever dropped it.
                    pass
            # A task that still ends pending would report "Task was destroyed but it is
            # pending!" to this loop at finalisation, which would keep both alive.
            task._log_destroy_pending = False  # type: ignore[attr-defined]
        for task in tasks:
            if not task.done():
                task.cancel()
        if self._ready:
            self._drain(64 * (len(tasks) + 1))
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: its finaliser has nothing to report
        self._ready = None
        self.tasks.clear()
        self.errors = None
        self._closed = True

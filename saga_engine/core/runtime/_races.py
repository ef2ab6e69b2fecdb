"""Races and timeout scopes: ``ctx.first`` and ``ctx.timeout``, decided by history.

Both run on the saga's deterministic loop, so the winner is the racer whose input comes
first in the history (a reply, a timer, a signal, a domain event): an input settles one
racer, the code runs until it waits again, and by then the race is decided and its losers
given up, before the next input is handled. A replay delivers the same inputs in the
same order and picks the same winner.

A racer, or the block of a scope, is given up by cancelling it. What it waited on ends
with it (a timer, a signal's or a domain event's wait), and a step in flight is given up
by its own code (``_undo.give_up``): recorded as ``step_abandoned``, and compensated at
once if its command may have been applied. Nothing here knows about steps: a race over a
child saga, a step or a timer is the same race.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Coroutine, Mapping
from datetime import timedelta
from types import TracebackType
from typing import Any, NoReturn

from saga_engine.core.authoring._context import RACEABLE, Callback, Winner
from saga_engine.core.history._events import TimerStarted
from saga_engine.core.history._fold import SCOPE_PREFIX
from saga_engine.core.runtime._intents import check_open, emit, next_id
from saga_engine.core.runtime._state import SagaState
from saga_engine.kernel._errors import SagaTimeout


async def first(s: SagaState, racers: Mapping[str, object]) -> Winner[Any]:
    """The first of ``racers`` to finish, by name, with its value (or its exception,
    raised); the others are given up before this returns."""
    coros = _checked(s, racers)
    try:
        check_open(s)
    except asyncio.CancelledError:
        _close(coros.values())
        raise
    won: asyncio.Future[asyncio.Task[Any]] = s.loop.create_future()

    def settle(task: asyncio.Task[Any]) -> None:
        if not won.done():
            won.set_result(task)

    tasks: dict[str, asyncio.Task[Any]] = {}
    try:
        # Started one at a time, in order: one that finishes at once (a signal already
        # buffered) wins before the next one records anything.
        for name, coro in coros.items():
            task = tasks[name] = s.loop.create_task(coro)
            task.add_done_callback(settle)
            await asyncio.sleep(0)  # the racer runs until it waits
            if any(t.done() for t in tasks.values()):
                break
        winner = await won
    except asyncio.CancelledError as stopped:
        # The saga stops, or an enclosing race or scope gave this one up: so are all its
        # racers (how depends on why: see ``_undo.give_up``).
        _close(c for n, c in coros.items() if n not in tasks)
        await _give_up(tasks.values(), stopped.args[0] if stopped.args else None)
        raise
    _close(c for n, c in coros.items() if n not in tasks)
    name = next(n for n, t in tasks.items() if t is winner)
    await _give_up((t for t in tasks.values() if t is not winner), f"lost to {name!r}")
    return Winner(name, winner.result())


async def _give_up(tasks: Any, why: str | None) -> None:
    """Cancels ``tasks`` and waits until each has stopped (each records its own end)."""
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel(why)
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


def _close(coros: Any) -> None:
    for coro in coros:
        coro.close()  # never started: nothing to give up, and no "never awaited" warning


def _checked(s: SagaState, racers: Mapping[str, object]) -> dict[str, Coroutine[Any, Any, Any]]:
    """The racers as the coroutines of ctx operations, not yet started; a definition
    error (the saga parks) for anything else."""
    problem = _problem(s, racers)
    if problem is not None:
        _close(c for c in racers.values() if inspect.iscoroutine(c) and c.cr_frame is not None)
        s.definition_error(problem)
    return dict(racers)  # type: ignore[arg-type]


def _problem(s: SagaState, racers: Mapping[str, object]) -> str | None:
    if not racers:
        return (
            "ctx.first needs something to race, e.g. ctx.first(paid=ctx.wait_signal(...), "
            "expired=ctx.sleep(...))"
        )
    seen: set[int] = set()
    for name, racer in racers.items():
        what = f"ctx.first({name}=...)"
        if not inspect.iscoroutine(racer):
            kind = "an awaitable" if inspect.isawaitable(racer) else "not awaitable"
            return (
                f"{what} got {racer!r} ({kind}); pass a ctx operation as you call it, e.g. "
                f"{name}=ctx.sleep(...), not a value, a task or a future"
            )
        op = RACEABLE.get(racer.cr_code)
        if op is None:
            return (
                f"{what} got a call of {racer.cr_code.co_qualname}, which is not a ctx "
                "operation: race ctx.step, ctx.http_step, ctx.child, ctx.sleep, "
                "ctx.wait_signal, ctx.wait_event, ctx.wait_update, a callback's wait() or ctx.first itself; to race several "
                "steps, race a ctx.child saga that runs them, or bound them with "
                "`async with ctx.timeout(...)`"
            )
        if inspect.getcoroutinestate(racer) != inspect.CORO_CREATED or id(racer) in seen:
            return f"{what}: that {op}(...) call is already awaited (or raced twice)"
        owner = racer.cr_frame.f_locals.get("self") if racer.cr_frame is not None else s.ctx
        if (owner.context if isinstance(owner, Callback) else owner) is not s.ctx:
            return f"{what}: that {op}(...) call is another saga's context's"
        seen.add(id(racer))
    return None


class TimeoutScope:
    """``async with ctx.timeout(delta):``: a durable timer recorded when the block
    begins; if it fires first, the block's task is cancelled (what it waits on is given
    up) and :class:`SagaTimeout` raised where the block stood. Modelled on
    ``asyncio.timeout``: only this scope's own firing becomes its ``SagaTimeout``."""

    __slots__ = ("delta", "exited", "expired", "s", "task", "timer_id", "uncancelled")

    def __init__(self, s: SagaState, delta: timedelta) -> None:
        self.s, self.delta = s, delta
        self.task: asyncio.Task[Any] | None = None
        self.timer_id = ""
        self.expired = self.exited = False
        self.uncancelled = 0

    def __enter__(self) -> NoReturn:
        self.s.definition_error(
            "ctx.timeout(...) is an async context manager: `async with ctx.timeout(...):`"
        )

    def __exit__(self, *exc: object) -> None:  # pragma: no cover (never entered)
        return None

    async def __aenter__(self) -> None:
        s = self.s
        check_open(s)
        task = asyncio.current_task()
        if self.task is not None or task is None or task.get_loop() is not s.loop:
            s.definition_error(
                "a ctx.timeout(...) scope is entered once, by the saga's own code: write "
                "`async with ctx.timeout(...):` where the block begins",
            )
        self.task, self.uncancelled = task, task.cancelling()
        self.timer_id = f"{SCOPE_PREFIX}{next_id(s, 'scope')}"
        emit(
            s,
            TimerStarted(
                at=s.now, timer_id=self.timer_id, purpose="sleep", fire_at=s.now + self.delta
            ),
        )
        fired: asyncio.Future[None] = s.loop.create_future()
        fired.add_done_callback(self._fire)
        s.timers[self.timer_id].future = fired

    def _fire(self, fired: asyncio.Future[None]) -> None:
        if fired.cancelled() or self.exited or self.task is None:
            return
        self.expired = True
        self.task.cancel(f"ctx.timeout({self.delta}) expired ({self.timer_id})")

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.exited = True
        self.s.timers.pop(self.timer_id, None)  # the block is over: its timer no longer
        if (
            self.expired
            and kind is asyncio.CancelledError
            and self.task is not None
            and self.task.uncancel() <= self.uncancelled
        ):
            raise SagaTimeout(self.delta, self.timer_id) from error

"""How the saga's code records what it intends, and waits for the answer.

The primitives under ``_operations`` (what ``ctx`` does) and ``_lifecycle`` (the run and
its compensations): an intent is recorded, or on replay matched against the recorded one
(:func:`emit`); a command's reply and a timer's firing are awaited on the command or timer
the fold holds (:func:`await_command`, :func:`await_timer`).
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import timedelta
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from saga_engine.core.history._events import (
    CommandIssued,
    CompensationIssued,
    Event,
    ReplyReceived,
    TimerStarted,
)
from saga_engine.core.history._fold import owned, timeout_timer_id
from saga_engine.core.runtime._state import Halt, SagaState

E = TypeVar("E", bound=Event)


def emit(s: SagaState, event: E) -> E:
    """Records an intent, or on replay matches it against the recorded one."""
    if s.nondeterminism is not None:
        raise Halt
    if s.cursor < len(s.history):
        recorded = s.history[s.cursor]
        if recorded.is_intent and recorded.signature() == event.signature():
            s.cursor += 1
            s.apply(recorded)
            return recorded  # type: ignore[return-value]
        s.nondeterministic(s.cursor, recorded.describe(), event.describe())
        raise Halt
    s.history.append(event)
    s.new.append(event)
    s.cursor += 1
    s.apply(event)
    return event


def end_with_timer(s: SagaState, timer_id: str, future: asyncio.Future[Any]) -> None:
    """A wait with a timeout: when the fold's timer ``timer_id`` fires, ``future`` gets
    None (unless its answer came first)."""
    timer = s.timers.get(timer_id)
    if timer is not None:
        timer_future: asyncio.Future[None] = s.loop.create_future()
        timer_future.add_done_callback(
            lambda _: future.done() or future.set_result(None)  # type: ignore[func-returns-value]
        )
        timer.future = timer_future


def next_id(s: SagaState, kind: str) -> int:
    s.counters = owned(s.counters)
    return next(s.counters.setdefault(kind, itertools.count(1)))


def check_open(s: SagaState) -> None:
    if s.nondeterminism is not None:
        raise Halt
    if s.closing or s.cancel_reason is not None:
        # The run is over (failed, cancelled or finished): no new operations.
        raise asyncio.CancelledError()


async def await_command(
    s: SagaState, event: CommandIssued | CompensationIssued, returns: type[BaseModel] | None = None
) -> ReplyReceived | None:
    """Waits for the answer to a command just emitted: its reply, or None when the
    attempt timed out."""
    future = command_future(s, event, returns)
    try:
        return await future
    finally:
        forget_command(s, event)


def command_future(
    s: SagaState, event: CommandIssued | CompensationIssued, returns: type[BaseModel] | None
) -> asyncio.Future[ReplyReceived | None]:
    """What the code awaits for the answer to a command just emitted (``await_command``;
    a forward step awaits it in its own frame, one coroutine fewer per waiting saga):
    its reply, or None when the attempt timed out. ``forget_command`` once it is over."""
    future: asyncio.Future[ReplyReceived | None] = s.loop.create_future()
    sent = s.inflight[event.command_id]
    sent.future, sent.returns = future, returns
    return future


def forget_command(s: SagaState, event: CommandIssued | CompensationIssued) -> None:
    """The wait for ``event``'s answer is over: answered (the fold let go of it, and of
    its attempt's timer, already), or given up by the code (its task cancelled), which
    no event records."""
    if s.inflight.pop(event.command_id, None) is not None and event.timeout_at is not None:
        s.timers.pop(timeout_timer_id(event.command_id, event.attempt), None)
    if s.polls:
        s.polls.pop(event.command_id, None)


async def await_timer(
    s: SagaState, timer_id: str, purpose: Literal["sleep", "retry"], delay: timedelta
) -> None:
    emit(s, TimerStarted(at=s.now, timer_id=timer_id, purpose=purpose, fire_at=s.now + delay))
    future: asyncio.Future[None] = s.loop.create_future()
    s.timers[timer_id].future = future
    try:
        await future
    finally:
        s.timers.pop(timer_id, None)

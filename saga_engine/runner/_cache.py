"""The sagas an engine holds in memory: their locks, their timers, their eviction.

- **Locks.** Everything done to one saga (its inputs, timers, operator actions) is
  serialised by one asyncio lock per saga id. A lock lives only while someone holds it
  or waits for it (``KeyedLocks``), so an engine that has driven millions of sagas holds
  locks for the few it is working on right now.
- **Timers.** A saga in memory has one timer armed for its next wake-up. Evicted, it has
  none: its wake-up is due from the store, which the owning worker polls.
- **Eviction.** Bounded by ``engine.cache_size``, least recently changed first; a saga
  that only waits (no command out) is evicted once idle for ``engine.idle_evict_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from saga_engine.core.runtime._runtime import SagaRuntime
from saga_engine.runner._clock import Clock, TimerHandle

log = logging.getLogger("saga_engine.engine")


class FlowTimers(Protocol):
    """Flow control's view of a saga's timers (``_flow_sender.FlowControl``)."""

    def timers(self, saga_id: str, runtime: SagaRuntime) -> dict[str, datetime]: ...

    def next_wakeup(self, saga_id: str, runtime: SagaRuntime) -> datetime | None: ...


@dataclass(slots=True)
class LiveSaga:
    runtime: SagaRuntime
    committed_seq: int
    timer: TimerHandle | None = None
    started_at: datetime | None = None
    #: Loaded as its owner (so what it has in flight was re-sent); False when loaded
    #: only to apply one input to a saga another engine drives.
    driven: bool = True
    #: When an input last changed it (the event loop's clock): idle eviction's measure.
    touched: float = 0.0


class KeyedLocks:
    """One lock per key, first come first served, living only while held or awaited.

    A lock nobody waits for is its key in a dict, nothing more: taken and given back
    once per saga per batch, an ``asyncio.Lock`` and an entry for it were built and
    dropped each time. The first waiter adds the queue of waiters' futures; a release
    hands the lock to the first waiter still waiting, or drops the key."""

    def __init__(self) -> None:
        #: Held keys: None while nobody waits, else the waiters' futures in order.
        self._entries: dict[str, deque[asyncio.Future[None]] | None] = {}

    async def acquire(self, key: str) -> None:
        entries = self._entries
        if key not in entries:
            entries[key] = None  # free: taken without a wait
            return
        waiters = entries[key]
        if waiters is None:
            waiters = entries[key] = deque()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(future)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.release(key)  # handed over as it was cancelled: passed on
            else:
                with contextlib.suppress(ValueError):  # a release skipped it already
                    waiters.remove(future)
            raise

    def release(self, key: str) -> None:
        waiters = self._entries[key]
        while waiters:
            future = waiters.popleft()
            if not future.done():  # (a cancelled waiter's is done)
                future.set_result(None)  # handed over: the key stays held
                return
        del self._entries[key]

    def held(self, key: str) -> bool:
        """Someone holds or waits for ``key``'s lock."""
        return key in self._entries

    def hold(self, key: str) -> _Held:
        """``async with locks.hold(key):`` holds ``key``'s lock for the block."""
        return _Held(self, key)

    def __len__(self) -> int:
        return len(self._entries)


class _Held:
    __slots__ = ("_key", "_locks")

    def __init__(self, locks: KeyedLocks, key: str) -> None:
        self._locks = locks
        self._key = key

    async def __aenter__(self) -> None:
        await self._locks.acquire(self._key)

    async def __aexit__(self, *exc: object) -> None:
        self._locks.release(self._key)


class LiveSagas:
    """The sagas held in memory: their copies, locks and timers, and idle eviction.

    ``on_evict`` is told of every saga let go (the observer drops its open spans: whoever
    loads it next re-sends what it has in flight); a copy replaced by ``put`` (rebuilt
    from history) is not let go."""

    def __init__(
        self, clock: Clock, on_evict: Callable[[str], None] = lambda saga_id: None
    ) -> None:
        self._clock = clock
        self._on_evict = on_evict
        #: Fires a saga's due timers (the engine's, set by ``when_due``).
        self._on_due: Callable[[str], Awaitable[None]] | None = None
        self._closed = False
        #: Least recently changed first (``arm`` moves a saga to the end): the order
        #: eviction looks at them in.
        self._entries: OrderedDict[str, LiveSaga] = OrderedDict()
        self.locks = KeyedLocks()
        #: Flow control, when a limit is configured: a held attempt's timeout counts from
        #: its send, so it decides what is due (``timers``, ``arm``).
        self.flow: FlowTimers | None = None

    def when_due(self, on_due: Callable[[str], Awaitable[None]]) -> None:
        """Who fires a saga's timers when they are due."""
        self._on_due = on_due

    def get(self, saga_id: str) -> LiveSaga | None:
        return self._entries.get(saga_id)

    def __contains__(self, saga_id: object) -> bool:
        return saga_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def ids(self) -> list[str]:
        return list(self._entries)

    def put(self, saga_id: str, live: LiveSaga) -> None:
        """Holds ``live``; a copy held before (a stale one, rebuilt from history) is
        closed, not let go: what it had in flight carries on in the new one."""
        previous = self._entries.get(saga_id)
        self._entries[saga_id] = live
        if previous is not None and previous is not live:
            _close(saga_id, previous)

    def lock(self, saga_id: str) -> _Held:
        return self.locks.hold(saga_id)

    def arm(self, saga_id: str, live: LiveSaga) -> None:
        """After a change: marks the saga used now and arms a timer for its next wake-up
        (a due one fires at once)."""
        live.touched = asyncio.get_running_loop().time()
        if saga_id in self._entries:
            self._entries.move_to_end(saga_id)
        if live.timer is not None:
            live.timer.cancel()
            live.timer = None
        if self._closed or live.runtime.dead or live.runtime.status.is_terminal:
            return
        wakeup = (
            live.runtime.next_wakeup()
            if self.flow is None
            else self.flow.next_wakeup(saga_id, live.runtime)
        )
        on_due = self._on_due
        if wakeup is not None and on_due is not None:
            live.timer = self._clock.call_at(wakeup, lambda: on_due(saga_id))

    def timers(self, saga_id: str, live: LiveSaga) -> dict[str, datetime]:
        """The saga's pending timers by id, with their due times (flow control's view)."""
        if self.flow is None:
            return live.runtime.pending_timers()
        return self.flow.timers(saga_id, live.runtime)

    def open_saga_counts(self) -> dict[str, int]:
        """Sagas held in memory, by type (the ``saga.open`` gauge, ``Telemetry.watch``)."""
        counts: Counter[str] = Counter()
        for live in self._entries.values():
            counts[live.runtime.saga_type] += 1
        return dict(counts)

    def holds_timer(self, saga_id: str) -> bool:
        """The saga is in memory with a timer armed: its wake-up needs no poller."""
        live = self._entries.get(saga_id)
        return live is not None and live.timer is not None

    def suspend(self, saga_id: str) -> None:
        """Stops the saga's timers, keeping it in memory: its partition is being
        reassigned, and until the assignment says who owns it nobody should drive it."""
        live = self._entries.get(saga_id)
        if live is not None and live.timer is not None:
            live.timer.cancel()
            live.timer = None

    def rearm(self, saga_id: str) -> None:
        """Starts the timers of a saga kept across a reassignment (``suspend``) again;
        one due while it was suspended fires at once."""
        live = self._entries.get(saga_id)
        if live is not None:
            self.arm(saga_id, live)

    def evict(self, saga_id: str) -> None:
        """Forgets the in-memory copy; the next input rebuilds it from the store."""
        live = self._entries.pop(saga_id, None)
        self._on_evict(saga_id)
        if live is not None:
            _close(saga_id, live)

    def evict_idle(
        self, idle_s: float, max_size: int, keep_due_before: datetime | None = None
    ) -> int:
        """Evicts the sagas that wait on nothing but a timer or a signal and have not
        changed for ``idle_s`` seconds, then, while more than ``max_size`` are held, the
        least recently changed ones (those waiting on a reply too: reloaded for it, they
        re-send what they have in flight, which participants deduplicate). A saga in use
        (its lock held or awaited) is left alone, and so is an idle one whose wake-up is
        due before ``keep_due_before`` (loaded ahead of it). Returns how many were
        evicted."""
        now = asyncio.get_running_loop().time()
        over = len(self._entries) - max_size
        evicted = 0
        for saga_id, live in list(self._entries.items()):
            if self.locks.held(saga_id):
                continue
            idle = now - live.touched >= idle_s
            if not idle and over <= 0:
                break  # least recently changed first: the rest changed later still
            if over <= 0 and keep_due_before is not None:
                wakeup = live.runtime.next_wakeup()
                if wakeup is not None and wakeup < keep_due_before:
                    continue  # loaded for a wake-up that is about to be due
            if over > 0 or (idle and not live.runtime.awaits_reply):
                self.evict(saga_id)
                over -= 1
                evicted += 1
        return evicted

    def close(self) -> None:
        """Lets every saga go and arms no timer any more (the engine is closing)."""
        self._closed = True
        for saga_id in list(self._entries):
            self.evict(saga_id)


def _close(saga_id: str, live: LiveSaga) -> None:
    if live.timer is not None:
        live.timer.cancel()
    try:
        live.runtime.close()
    except Exception:  # a bug there must not stop whoever evicts (a loop, a poll)
        log.exception("closing the runtime of saga %s failed", saga_id)

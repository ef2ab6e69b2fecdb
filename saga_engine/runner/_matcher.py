"""Owed matches: a saga that waits for a domain event gets the stored facts that match.

Whatever a waiting saga is owed is derived from its history (its open ``event_awaited``
waits) and the facts the store keeps, and offered again until its history records one:

- after a write that leaves the saga waiting, once it is committed (``owed``): a fact
  stored before the wait was committed is seen here, and one stored after it finds the
  wait in history (the consumer asks ``waiting`` once its fact is committed, and has the
  saga's owner reload it): whichever side commits second sees the other;
- when a saga is loaded (recovery, a reload, a wake-up): the same;
- every ``poll_s`` for the sagas held that still wait (a lookup the store failed).

Each fact goes to the saga as an input through the engine's one path (a batch per
saga); the saga records it once (``domain_event_received``) or drops it (received
already, or no wait for it any more). A saga that never waits costs one attribute test
per pass (``Effects``), and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from saga_engine.core.history._decision import EventInput
from saga_engine.kernel._errors import SagaError, TransientError
from saga_engine.runner._cache import LiveSagas
from saga_engine.runner._clock import Clock
from saga_engine.runner._observer import EngineStats
from saga_engine.runner._path_inputs import Deliver, Input, InputOutcome
from saga_engine.store._domain_store import DomainEventStore, StoredFact

log = logging.getLogger("saga_engine.events")

Apply = Callable[[Sequence[Input]], Awaitable[list[InputOutcome]]]
#: Tells a saga's owner to look at it again (a reload through the inbox).
Nudge = Callable[[str], Awaitable[None]]


async def take_fact(
    store: DomainEventStore,
    fact: StoredFact,
    nudge: Nudge,
    crash: Callable[[str], None] | None = None,
) -> list[str]:
    """Keeps ``fact``, then nudges every saga waiting for its source and key (after the
    insert commits: a saga whose wait commits later finds the fact itself). Returns them."""
    await store.record(fact)
    if crash is not None:
        crash("event_after_store")  # kept, no saga told, its offset not committed
    waiting = await store.waiting(fact.source, fact.key)
    for saga_id in waiting:
        await nudge(saga_id)
    return waiting


class EventMatcher:
    def __init__(
        self,
        store: DomainEventStore,
        live: LiveSagas,
        clock: Clock,
        stats: EngineStats,
        poll_s: float = 5.0,
    ) -> None:
        self.store = store
        self._live = live
        self._clock = clock
        self._stats = stats
        self._poll_s = poll_s
        self._apply: Apply | None = None
        #: Sagas owed a look at the store; sagas held that wait (the poll's).
        self._owed: set[str] = set()
        self._waiting: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def bind(self, apply: Apply) -> None:
        """The engine's one path, which the facts go through."""
        self._apply = apply

    def wait_committed(self, saga_id: str) -> None:
        """``saga_id`` waits for a domain event, and its wait is committed."""
        self._owed.add(saga_id)
        self._waiting.add(saga_id)
        self._wake.set()

    @property
    def pending(self) -> bool:
        return bool(self._owed)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="saga-events")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self._poll_s):
                    await self._wake.wait()
            except TimeoutError:
                self._owed |= self._waiting  # the poll: every saga held that waits
                await self._quietly(self.expire)
            self._wake.clear()
            await self._quietly(self.drain)

    @staticmethod
    async def _quietly(work: Callable[[], Awaitable[Any]]) -> None:
        try:
            await work()
        except TransientError as exc:
            log.warning("domain events: %s; trying again at the next poll", exc)
        except Exception:  # a bug must not end the loop: every waiting saga hangs on it
            log.exception("domain events: failed; trying again at the next poll")

    async def expire(self) -> None:
        """Drops the facts past their source's retention, counting those no saga got."""
        expired = await self.store.expire(self._clock.now())
        if expired.dropped:
            self._stats.inc("domain_events_expired", expired.dropped)
        if expired.unmatched:
            self._stats.inc("domain_events_expired_unmatched", expired.unmatched)
            log.info("%d domain events expired that no saga waited for", expired.unmatched)

    async def drain(self) -> None:
        """Offers every saga owed a look the facts that match its open waits (one that
        fails to take them is owed again, at the next poll)."""
        owed, self._owed = sorted(self._owed), set()
        for saga_id in owed:
            try:
                await self._offer(saga_id)
            except TransientError as exc:
                log.warning("domain events for saga %s: %s; offered again later", saga_id, exc)
                self._owed.add(saga_id)

    async def _offer(self, saga_id: str) -> None:
        live = self._live.get(saga_id)
        # A copy loaded only to apply one input for another engine is that engine's to
        # offer facts to (its own load looks).
        if live is None or not live.driven or not live.runtime.state.event_waits:
            self._waiting.discard(saga_id)  # a load of it (if it still waits) owes again
            return
        if self._apply is None:
            return
        seen = live.runtime.state.seen_events
        offered: list[EventInput] = []
        for source, key in sorted({(w.source, w.key) for w in live.runtime.event_waits()}):
            offered += [
                EventInput(f.source, f.key, f.event_id, self._clock.now(), f.payload)
                for f in await self.store.kept(source, key, self._clock.now())
                if f.event_id not in seen
            ]
        if not offered:
            return
        outcomes = await self._apply([Deliver(saga_id, inbound) for inbound in offered])
        for inbound, outcome in zip(offered, outcomes, strict=True):
            if isinstance(outcome.error, TransientError):
                self._owed.add(saga_id)  # its write failed: the next poll offers it again
            elif isinstance(outcome.error, SagaError):
                log.warning("domain event for saga %s: %s", saga_id, outcome.error)
            elif outcome.decision is not None and outcome.decision.dropped is None:
                self._stats.inc("domain_events_matched")
                # One database marked it in the append's own transaction
                # (store/_pgdomain's mark_received); this mark serves the adapters that
                # cannot: in memory, and a fact kept in another shard than the saga's
                # (store/_sharded_domain: a crash before it leaves the fact unmarked).
                await self.store.mark_matched(inbound.source, inbound.event_id, key=inbound.key)

"""The port of the domain events sagas wait for (``EventSource`` facts), and its
in-memory adapter.

A fact is stored once (its id: the record's ``ce_id`` header, else its topic, partition
and offset), kept until its source's retention has passed, and offered to every saga
that waits for its source and key: the sagas waiting when it arrives (``waiting``), and
the sagas that wait later, while it is kept (``kept``). The history is what says a saga
waits (its ``event_awaited`` events) and what it received: the store adds only the facts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from saga_engine.core.history._events import DomainEventReceived, EventAwaited
from saga_engine.kernel._serde import JsonDict

__all__ = ["DomainEventStore", "Expired", "InMemoryDomainEventStore", "StoredFact"]


@dataclass(frozen=True, slots=True)
class StoredFact:
    """One domain event as it is kept."""

    source: str
    key: str
    event_id: str
    payload: JsonDict
    received_at: datetime
    expires_at: datetime
    topic: str = ""
    partition: int = -1
    offset: int = -1
    #: A saga recorded it (it answered a wait).
    matched: bool = False


@dataclass(frozen=True, slots=True)
class Expired:
    """What one expiry pass dropped: every fact past its retention, and of them those
    that no saga ever received."""

    dropped: int = 0
    unmatched: int = 0


class DomainEventStore(Protocol):
    async def record(self, fact: StoredFact) -> bool:
        """Keeps ``fact``; False when a fact of that source and id is kept already."""
        ...

    async def waiting(self, source: str, key: str) -> list[str]:
        """The open sagas whose history waits (or waited) for ``source`` and ``key``."""
        ...

    async def kept(self, source: str, key: str, now: datetime) -> list[StoredFact]:
        """The facts of ``source`` and ``key`` not expired at ``now``, oldest first."""
        ...

    async def mark_matched(self, source: str, event_id: str, *, key: str) -> None:
        """Marks the fact received by some saga (``key``: the fact's, where it is kept)."""
        ...

    async def expire(self, now: datetime) -> Expired:
        """Drops the facts whose retention has passed at ``now``."""
        ...

    async def recent(
        self, *, source: str | None = None, unmatched: bool = False, limit: int = 100
    ) -> list[StoredFact]:
        """The facts kept, newest first (an operator's listing)."""
        ...

    async def receivers(self, facts: Sequence[StoredFact]) -> dict[tuple[str, str], list[str]]:
        """For each of ``facts`` some saga received, by (source, event id): the sagas whose
        history recorded it (``domain_event_received``), sorted (the operator's page)."""
        ...

    async def close(self) -> None: ...


#: The histories the in-memory adapter reads waits from: the open sagas' events.
OpenHistories = Callable[[], Awaitable[dict[str, list[Any]]]]


class InMemoryDomainEventStore:
    """The facts in a dict; the waits read from the histories ``histories`` gives (the
    open sagas of the in-memory event store), the receivers from those ``everyone`` gives
    (every saga's; the open ones' when not given)."""

    def __init__(self, histories: OpenHistories, everyone: OpenHistories | None = None) -> None:
        self._histories = histories
        self._everyone = everyone or histories
        self._facts: dict[tuple[str, str], StoredFact] = {}

    async def record(self, fact: StoredFact) -> bool:
        if (fact.source, fact.event_id) in self._facts:
            return False
        self._facts[fact.source, fact.event_id] = fact
        return True

    async def waiting(self, source: str, key: str) -> list[str]:
        out = []
        for saga_id, events in (await self._histories()).items():
            if any(_waits_for(e, source, key) for e in events):
                out.append(saga_id)
        return sorted(out)

    async def kept(self, source: str, key: str, now: datetime) -> list[StoredFact]:
        found = [
            f
            for f in self._facts.values()
            if f.source == source and f.key == key and f.expires_at > now
        ]
        return sorted(found, key=lambda f: (f.received_at, f.event_id))

    async def mark_matched(self, source: str, event_id: str, *, key: str) -> None:
        fact = self._facts.get((source, event_id))
        if fact is not None:
            self._facts[source, event_id] = replace(fact, matched=True)

    async def expire(self, now: datetime) -> Expired:
        gone = [k for k, f in self._facts.items() if f.expires_at <= now]
        unmatched = sum(not self._facts[k].matched for k in gone)
        for k in gone:
            del self._facts[k]
        return Expired(len(gone), unmatched)

    async def recent(
        self, *, source: str | None = None, unmatched: bool = False, limit: int = 100
    ) -> list[StoredFact]:
        found = [
            f
            for f in self._facts.values()
            if (source is None or f.source == source) and not (unmatched and f.matched)
        ]
        found.sort(key=lambda f: (f.received_at, f.event_id), reverse=True)
        return found[:limit]

    async def receivers(self, facts: Sequence[StoredFact]) -> dict[tuple[str, str], list[str]]:
        wanted = {(f.source, f.event_id) for f in facts if f.matched}
        out: dict[tuple[str, str], list[str]] = {}
        if not wanted:
            return out
        for saga_id, events in sorted((await self._everyone()).items()):
            for e in events:
                if isinstance(e, DomainEventReceived) and (e.source, e.event_id) in wanted:
                    out.setdefault((e.source, e.event_id), []).append(saga_id)
        return out

    async def close(self) -> None:
        return None


def _waits_for(event: object, source: str, key: str) -> bool:
    return isinstance(event, EventAwaited) and event.source == source and event.key == key

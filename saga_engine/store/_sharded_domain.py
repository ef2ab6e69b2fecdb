"""The domain events past one database: ``ShardedDomainEventStore``, the
``DomainEventStore`` port over one Postgres domain event store per shard (issue 43).

- A fact lives in the shard of its key: ``shard_of_saga(key)``, the shard a saga whose
  id were the key would live in, under the map in force (the event store's, read from
  the control database). ``record``, ``kept`` and ``mark_matched`` go there: one key's
  facts are one shard's rows.
- A saga's waits live in its history, in its own shard, whatever the key: ``waiting``
  asks every shard and merges. It fails (``ShardUnavailable``) when a shard does not
  answer, rather than leave out the waiters of that shard: an idle waiter evicted from
  its engine's memory is found only here, so the consumer keeps the record unacknowledged
  and asks again (the record is kept once; a fact of a key on the down shard holds the
  consumer the same way).
- ``receivers`` asks every shard (a fact's receivers live in theirs); ``recent`` merges
  each shard's newest, newest first; ``expire`` drops each shard's and adds the counts.
  These skip a shard that does not answer (``_coverage.missed``): its facts expire at a
  later pass, its facts and receivers are missing from that answer.

A saga records a fact through its own shard's group commit, which marks only a fact that
shard keeps (``_pgdomain.mark_received``): a fact of another shard is marked by the
matcher's ``mark_matched`` after the append. An engine killed between the two leaves a
received fact unmarked: it counts as unmatched when it expires
(``domain_events_expired_unmatched``) and shows as not matched meanwhile; nothing else
reads the mark. The routing and a shard's unavailability are ``ShardRouter``'s.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import cast

from saga_engine.core.history._codec import CodecChain
from saga_engine.kernel._settings import PostgresSettings
from saga_engine.kernel._shards import ShardMap
from saga_engine.store._domain_store import Expired, StoredFact
from saga_engine.store._pgdomain import PostgresDomainEventStore
from saga_engine.store._shard_router import ShardOpener, ShardRouter
from saga_engine.store._store import EventStore, as_utc
from saga_engine.telemetry._health import HealthBoard

__all__ = ["ShardedDomainEventStore"]


def _domain(store: EventStore) -> PostgresDomainEventStore:
    # The router keeps and closes what its openers open (here a shard's domain event
    # store, not an event store): nothing else of the port is called on it.
    if not isinstance(store, PostgresDomainEventStore):
        raise TypeError(f"a shard's store keeps no domain events: {type(store).__name__}")
    return store


def _newest(fact: StoredFact) -> tuple[datetime, str]:
    return as_utc(fact.received_at), fact.event_id


class ShardedDomainEventStore:
    """The domain events of a sharded store: ``shard_map`` gives the map in force (the
    event store's, so that a fact's shard follows it), ``settings`` the shards' addresses
    (``of_shard``); each shard's store opens on first use."""

    def __init__(
        self,
        shard_map: Callable[[], ShardMap],
        settings: PostgresSettings,
        codec: CodecChain | None,
        *,
        health: HealthBoard | None = None,
    ) -> None:
        def opener(name: str) -> ShardOpener:
            async def open_shard() -> EventStore:
                store = await PostgresDomainEventStore.connect(settings.of_shard(name), codec)
                return cast(EventStore, store)

            return open_shard

        in_force = shard_map()
        self._map = shard_map
        self._router = ShardRouter(
            in_force, {name: opener(name) for name in in_force.names}, health=health
        )

    def _of_key(self, key: str) -> str:
        return self._map().shard_of_saga(key)

    async def record(self, fact: StoredFact) -> bool:
        return await self._router.on_shard(
            self._of_key(fact.key), lambda s: _domain(s).record(fact)
        )

    async def waiting(self, source: str, key: str) -> list[str]:
        found = await self._router.on_every_shard(
            lambda _, s: _domain(s).waiting(source, key), partial=False
        )
        return sorted({saga_id for ids in found.values() for saga_id in ids})

    async def kept(self, source: str, key: str, now: datetime) -> list[StoredFact]:
        return await self._router.on_shard(
            self._of_key(key), lambda s: _domain(s).kept(source, key, now)
        )

    async def mark_matched(self, source: str, event_id: str, *, key: str) -> None:
        await self._router.on_shard(
            self._of_key(key), lambda s: _domain(s).mark_matched(source, event_id, key=key)
        )

    async def expire(self, now: datetime) -> Expired:
        found = await self._router.on_every_shard(lambda _, s: _domain(s).expire(now))
        return Expired(
            sum(e.dropped for e in found.values()), sum(e.unmatched for e in found.values())
        )

    async def recent(
        self, *, source: str | None = None, unmatched: bool = False, limit: int = 100
    ) -> list[StoredFact]:
        found = await self._router.on_every_shard(
            lambda _, s: _domain(s).recent(source=source, unmatched=unmatched, limit=limit)
        )
        # Each shard's page is newest first: the merge's first ``limit`` are the newest.
        merged = heapq.merge(*found.values(), key=_newest, reverse=True)
        return [fact for fact, _ in zip(merged, range(limit), strict=False)]

    async def receivers(self, facts: Sequence[StoredFact]) -> dict[tuple[str, str], list[str]]:
        if not any(f.matched for f in facts):
            return {}
        found = await self._router.on_every_shard(lambda _, s: _domain(s).receivers(facts))
        out: dict[tuple[str, str], set[str]] = {}
        for receivers in found.values():
            for fact, saga_ids in receivers.items():
                out.setdefault(fact, set()).update(saga_ids)
        return {fact: sorted(ids) for fact, ids in sorted(out.items())}

    async def close(self) -> None:
        await self._router.close()

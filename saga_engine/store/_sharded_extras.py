"""The sharded store's other ports: the insights' aggregates (``InsightStore``: each shard
keeps those of its sagas' runs; a read adds the shards' up) and per-key concurrency's
slots (``KeySlotStore``: a key's slots live in the shard its key falls in, as a saga id
would, so one key's queue is one shard's rows under one lock).

Mixed into ``ShardedEventStore``; the routing is ``ShardRouter``'s."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final

from saga_engine.core.views._insight_report import LearnedCost, learned_costs
from saga_engine.core.views._insights import Counters, InsightRow
from saga_engine.kernel._errors import SagaNotFound, ShardUnavailable
from saga_engine.store._insight_store import InsightStore
from saga_engine.store._keyslots import KeySlot, KeySlotStore, KeyTurn
from saga_engine.store._shard_router import ShardRouter
from saga_engine.store._store import EventStore, as_utc

#: Per-saga reads a merge or a sweep makes at a time.
_LOOKUPS: Final = 16


def _insights(store: EventStore) -> InsightStore:
    if not isinstance(store, InsightStore):
        raise TypeError(f"a shard's store keeps no insights: {type(store).__name__}")
    return store


def _key_slots(store: EventStore) -> KeySlotStore:
    if not isinstance(store, KeySlotStore):
        raise TypeError(f"a shard's store keeps no key slots: {type(store).__name__}")
    return store


class ShardedInsights(ShardRouter):
    """``InsightStore`` across shards: the roll-up runs on each, a read sums them."""

    async def roll_up_insights(self, limit: int = 2000) -> int:
        added = await self.on_every_shard(lambda _, s: _insights(s).roll_up_insights(limit))
        return sum(added.values())

    async def insight_rows(
        self, saga_type: str, since: datetime, until: datetime, flow_policy: int | None = None
    ) -> list[InsightRow]:
        found = await self.on_every_shard(
            lambda _, s: _insights(s).insight_rows(saga_type, since, until, flow_policy)
        )
        summed: dict[tuple[str, str, str], Counters] = {}
        for rows in found.values():
            for facet, key, detail, counters in rows:
                summed.setdefault((facet, key, detail), Counters()).add(counters)
        return [(*row, counters) for row, counters in summed.items()]

    async def insight_policies(
        self, saga_type: str, since: datetime, until: datetime
    ) -> dict[int, int]:
        found = await self.on_every_shard(
            lambda _, s: _insights(s).insight_policies(saga_type, since, until)
        )
        total: dict[int, int] = {}
        for policies in found.values():
            for policy, runs in policies.items():
                total[policy] = total.get(policy, 0) + runs
        return dict(sorted(total.items()))

    async def learned_costs(
        self, saga_type: str, since: datetime, until: datetime
    ) -> dict[str, LearnedCost]:
        # From the summed rows, as one store learns them from its own.
        return learned_costs(saga_type, await self.insight_rows(saga_type, since, until))

    async def sla_breaches(
        self,
        saga_type: str,
        since: datetime,
        until: datetime,
        sla: timedelta,
        limit: int = 20,
        flow_policy: int | None = None,
    ) -> list[str]:
        found = await self.on_every_shard(
            lambda _, s: _insights(s).sla_breaches(saga_type, since, until, sla, limit, flow_policy)
        )
        ids = [i for page in found.values() for i in page]
        if len(found) < 2:
            return ids[:limit]
        # The latest first across shards: each id's end, from its record.
        gate = asyncio.Semaphore(_LOOKUPS)

        async def ended(saga_id: str) -> tuple[datetime, str] | None:
            async with gate:
                try:
                    record = await self.on_saga(saga_id, lambda s: s.get(saga_id))
                except (SagaNotFound, ShardUnavailable):
                    return None
            return None if record.ended_at is None else (as_utc(record.ended_at), saga_id)

        ends = [e for e in await asyncio.gather(*(ended(i) for i in ids)) if e is not None]
        return [saga_id for _, saga_id in sorted(ends, reverse=True)[:limit]]


class ShardedKeySlots(ShardRouter):
    """``KeySlotStore`` across shards: a key's slots in the shard of its key."""

    async def acquire_key(
        self, saga_type: str, key: str, saga_id: str, limit: int, at: datetime
    ) -> KeyTurn:
        return await self.on_saga(
            key, lambda s: _key_slots(s).acquire_key(saga_type, key, saga_id, limit, at)
        )

    async def release_key(self, saga_id: str, at: datetime) -> list[str]:
        # The port names the saga, not its key: every shard is asked. One that does not
        # answer keeps the slot, if it held it, until the sweep's next pass.
        granted = await self.on_every_shard(lambda _, s: _key_slots(s).release_key(saga_id, at))
        return [i for each in granted.values() for i in each]

    async def sweep_keys(self, at: datetime, limit: int = 500) -> list[str]:
        """Releases the slots of sagas that ended or no longer exist. A slot's saga lives
        in its own shard, not always the key's: each is looked up where it lives (a
        shard's own sweep would take a saga of another shard for gone)."""
        slots = await self.on_every_shard(lambda _, s: _key_slots(s).key_slots())
        gate = asyncio.Semaphore(_LOOKUPS)

        async def gone(slot: KeySlot) -> bool:
            async with gate:
                try:
                    record = await self.on_saga(slot.saga_id, lambda s: s.get(slot.saga_id))
                except SagaNotFound:
                    return True
                except ShardUnavailable:
                    return False  # unknown: kept until its shard answers
            return record.status.is_terminal

        async def release(name: str, saga_id: str) -> list[str]:
            return await self.on_shard(name, lambda s: _key_slots(s).release_key(saga_id, at))

        candidates = [(name, slot) for name, rows in slots.items() for slot in rows]
        ended = await asyncio.gather(*(gone(slot) for _, slot in candidates))
        released = [
            (n, slot) for (n, slot), is_gone in zip(candidates, ended, strict=True) if is_gone
        ]
        granted: list[str] = []
        for name, slot in released[: max(limit, 0)]:
            granted += await release(name, slot.saga_id)
        return granted

    async def key_slots(
        self, saga_type: str | None = None, key: str | None = None
    ) -> list[KeySlot]:
        if key is not None:
            return await self.on_saga(key, lambda s: _key_slots(s).key_slots(saga_type, key))
        found = await self.on_every_shard(lambda _, s: _key_slots(s).key_slots(saga_type, key))
        # One key's rows are one shard's, in their order (held first, FIFO): a stable
        # sort by (type, key) keeps it.
        rows: Sequence[KeySlot] = [r for each in found.values() for r in each]
        return sorted(rows, key=lambda r: (r.saga_type, r.key))

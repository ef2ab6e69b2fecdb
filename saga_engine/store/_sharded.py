"""The event store past one database: ``ShardedEventStore``, the ``EventStore`` port over
one store per shard (issue 43), routed by a ``ShardMap``.

- One saga's operations (create, append, the loads, get, its archive) go to its shard:
  its inbox partition's (``ShardMap.shard_of_saga``). A shard that cannot be reached
  raises ``ShardUnavailable`` naming it; the other shards' sagas go on.
- Reads of partitions (recovery's open sagas, the timer poller's wake-ups, retention's
  candidates) ask only the shards holding those partitions.
- Reads of every saga (the listing, its counts, ``/metrics``' summary) ask every shard at
  once and merge, so that the answer is the one a single store holding every saga would
  give: the listing is a merge of each shard's page asked with the same cursor (each
  page holds its shard's first ``limit`` rows after the cursor, so the first ``limit`` of
  the merge are the single store's), and its last row is the same cursor. A shard that
  does not answer is left out and named through ``_coverage.missed``; the read fails
  (``ShardUnavailable``) only when no shard answered.

**Following the map.** Each shard refuses a create or an append of a partition it does
not hold as 'active' (its fence, ``_pgfence``: ``StaleShardMap``). On such a refusal the
sharded store reads the map in force from the control database (``map_loader``), routes
by it if its epoch is above its own, and writes the saga again, once, to its new shard;
when the saga's shard did not change (its range is 'moving', or the map could not be
read) the ``StaleShardMap`` is raised: the engine retries the input later, loading the
saga again from its shard. ``refresh_map`` (the worker's, every
``engine.rollout_refresh_s``: one cheap read of the epoch) keeps reads routed by the
newest map too, and a saga not found on its shard is looked for again on its shard in
the map in force (a client's store, which no worker refreshes, follows a move so).

Each shard's store is opened on first use: an engine that owns some partitions connects
to their shards only, until a read fans out. What is not per saga lives in the control
database: the rollouts and flow policies, handed there (``_sharded_control``), and the
schedules and batch operations, whose stores the worker opens there. Blobs of payloads by
reference live with their sagas, in their shard (``_sharded_blobs``).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Final, TypeVar

from saga_engine.core.history._codec import Undecodable
from saga_engine.core.history._events import SagaStarted
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import (
    SagaNotFound,
    ShardMapError,
    ShardUnavailable,
    StaleShardMap,
    TransientError,
)
from saga_engine.kernel._shards import ShardMap
from saga_engine.store._blobs import BlobStore
from saga_engine.store._shard_router import ShardOpener
from saga_engine.store._sharded_blobs import ShardedBlobs
from saga_engine.store._sharded_control import ControlOpener, ShardedControl
from saga_engine.store._sharded_extras import ShardedInsights, ShardedKeySlots
from saga_engine.store._store import (
    EVERY_SAGA,
    Append,
    ArchivedSaga,
    EventStore,
    ListOrder,
    LoadedSaga,
    NewSaga,
    OpenSummary,
    RunSpan,
    SagaFilter,
    SagaRecord,
    StoredEvent,
    as_utc,
)
from saga_engine.telemetry._health import HealthBoard

__all__ = ["ShardMapLoader", "ShardedEventStore"]

log = logging.getLogger("saga_engine.store")

#: Reads the map in force from the control database: the map if its epoch is above the
#: one given, None if it is not (``connect_event_store``'s reads the epoch first).
ShardMapLoader = Callable[[int], Awaitable[ShardMap | None]]

T = TypeVar("T")

#: Retention's candidates of a shard are read again, with twice the limit each time,
#: while children whose parent lives on another shard (kept) fill the batch: at most
#: this many reads, up to 64 times the limit. Past that, the pass takes fewer than
#: ``limit`` (a shard's SQL keeps only children of its own sagas' parents).
_RETENTION_ROUNDS: Final = 7
#: Per-saga reads a merge makes at a time (retention's end times and parents).
_LOOKUPS: Final = 16
#: A saga not found on its shard makes the map be read again at most this often (s).
_READ_REFRESH_S: Final = 1.0


class ShardedEventStore(ShardedInsights, ShardedKeySlots, ShardedControl, ShardedBlobs):
    """The ``EventStore`` port over one store per shard (``openers``: shard name -> what
    opens its store, called on first use), routed by ``shard_map``. ``control``: opens the
    control database's store, where rollouts and flow policies live (``RolloutStore``);
    ``blob_store``: the blob store the shards share, if not their own ``saga_blobs``."""

    def __init__(
        self,
        shard_map: ShardMap,
        openers: Mapping[str, ShardOpener],
        *,
        control: ControlOpener | None = None,
        blob_store: BlobStore | None = None,
        health: HealthBoard | None = None,
        map_loader: ShardMapLoader | None = None,
    ) -> None:
        super().__init__(shard_map, openers, health=health)
        self.attach_control(control)
        self.attach_blob_store(blob_store)
        #: Where a newer map comes from (None: the map given is followed for good).
        self._map_loader = map_loader
        self._refreshing = asyncio.Lock()
        self._read_refreshed_at = -_READ_REFRESH_S

    # ----------------------------------------------------------------- the map

    async def refresh_map(self, *, known: int | None = None) -> bool:
        """Reads the map in force and routes by it if it is newer than ``known`` (the
        epoch the caller routed by; the current one by default); whether the map is
        newer now. Several callers at once read it once. Errors of the read pass
        (transient ones: the control database did not answer)."""
        if self._map_loader is None:
            return False
        seen = self.shard_map.epoch if known is None else known
        async with self._refreshing:
            if self.shard_map.epoch > seen:
                return True  # read by another caller meanwhile
            found = await self._map_loader(seen)
            return found is not None and self.adopt(found)

    async def _write(self, saga_id: str, call: Callable[[EventStore], Awaitable[T]]) -> T:
        """A write of one saga on its shard; refused there for a stale map, once more on
        its shard in the map in force (see the module's docstring)."""
        before = self.shard_map
        try:
            return await self.on_saga(saga_id, call)
        except StaleShardMap as refused:
            try:
                await self.refresh_map(known=before.epoch)
            except (TransientError, ShardMapError) as exc:
                # The write stays refused, and retryable: a map this engine cannot follow
                # (a shard its settings lack) is the operator's to fix, not the input's.
                log.warning("following the shard map after %s failed: %s", refused, exc)
                raise refused from None  # not its cause: still transient
            if self.shard_map.shard_of_saga(saga_id) == before.shard_of_saga(saga_id):
                raise
        return await self.on_saga(saga_id, call)

    async def _read(self, saga_id: str, call: Callable[[EventStore], Awaitable[T]]) -> T:
        """A read of one saga on its shard; not found there, once more on its shard in
        the map in force if a move changed it (the map read at most every
        ``_READ_REFRESH_S``: a saga asked for before it exists costs no read each time)."""
        before = self.shard_map
        try:
            return await self.on_saga(saga_id, call)
        except SagaNotFound:
            now = time.monotonic()
            if self._map_loader is None or now - self._read_refreshed_at < _READ_REFRESH_S:
                raise
            self._read_refreshed_at = now
            try:
                await self.refresh_map(known=before.epoch)
            except (TransientError, ShardMapError) as exc:
                log.warning("following the shard map for a read of %s failed: %s", saga_id, exc)
                raise
            if self.shard_map.shard_of_saga(saga_id) == before.shard_of_saga(saga_id):
                raise
        return await self.on_saga(saga_id, call)

    # ----------------------------------------------------------------- one saga

    async def create(self, new: NewSaga) -> bool:
        return await self._write(new.saga_id, lambda s: s.create(new))

    async def append(self, append: Append) -> int:
        return await self._write(append.saga_id, lambda s: s.append(append))

    async def load(
        self, saga_id: str, *, undecodable: Undecodable = Undecodable.RAISE
    ) -> LoadedSaga:
        return await self._read(saga_id, lambda s: s.load(saga_id, undecodable=undecodable))

    async def load_run(
        self, saga_id: str, *, undecodable: Undecodable = Undecodable.RAISE
    ) -> LoadedSaga:
        return await self._read(saga_id, lambda s: s.load_run(saga_id, undecodable=undecodable))

    async def runs(self, saga_id: str) -> list[RunSpan]:
        return await self._read(saga_id, lambda s: s.runs(saga_id))

    async def load_after(
        self,
        saga_id: str,
        after_seq: int,
        *,
        kinds: Collection[str] | None = None,
        undecodable: Undecodable = Undecodable.RAISE,
    ) -> LoadedSaga:
        return await self._read(
            saga_id,
            lambda s: s.load_after(saga_id, after_seq, kinds=kinds, undecodable=undecodable),
        )

    async def first_event(self, saga_id: str) -> StoredEvent:
        return await self._read(saga_id, lambda s: s.first_event(saga_id))

    async def get(self, saga_id: str) -> SagaRecord:
        return await self._read(saga_id, lambda s: s.get(saga_id))

    async def archived_history(self, saga_id: str) -> bytes | None:
        return await self.on_saga(saga_id, lambda s: s.archived_history(saga_id))

    # ----------------------------------------------------------------- every saga

    async def list_sagas(
        self,
        where: SagaFilter = EVERY_SAGA,
        *,
        limit: int = 100,
        after_id: str | None = None,
        order: ListOrder = "id",
        after_activity: tuple[datetime, str] | None = None,
    ) -> list[SagaRecord]:
        pages = await self.on_every_shard(
            lambda _, s: s.list_sagas(
                where, limit=limit, after_id=after_id, order=order, after_activity=after_activity
            )
        )
        if order == "activity":
            merged = heapq.merge(
                *pages.values(), key=lambda r: (as_utc(r.activity_at), r.saga_id), reverse=True
            )
        else:
            merged = heapq.merge(*pages.values(), key=lambda r: r.saga_id)
        return list(itertools.islice(merged, max(limit, 0)))

    async def count_by_status(
        self, where: SagaFilter = EVERY_SAGA, *, cap: int
    ) -> dict[SagaStatus, int]:
        counts = await self.on_every_shard(lambda _, s: s.count_by_status(where, cap=cap))
        total: Counter[SagaStatus] = Counter()
        for each in counts.values():
            total.update(each)
        # Each shard stopped at cap: a sum of cap or more is "at least cap", as one says.
        return {status: min(n, cap) for status, n in total.items() if n}

    async def open_summary(self) -> OpenSummary:
        summaries = await self.on_every_shard(lambda _, s: s.open_summary())
        by_status: Counter[SagaStatus] = Counter()
        for summary in summaries.values():
            by_status.update(summary.by_status)
        parked = [
            as_utc(s.oldest_parked_at) for s in summaries.values() if s.oldest_parked_at is not None
        ]
        return OpenSummary(dict(by_status), min(parked, default=None))

    # ----------------------------------------------------------------- partitions

    async def open_saga_ids(
        self, partitions: Collection[int] | None = None, partition_count: int = 0
    ) -> list[str]:
        # Recovery acts on all of it (a saga left out would not be recovered): every
        # shard asked must answer, and the caller retries.
        plan = self.plan(partitions, partition_count)
        found = await self.on_shards(
            plan, lambda n, s: s.open_saga_ids(plan[n], partition_count), partial=False
        )
        return list(heapq.merge(*found.values()))

    async def due_wakeups(
        self,
        until: datetime,
        partitions: Collection[int] | None = None,
        partition_count: int = 0,
        limit: int = 1000,
        after: tuple[datetime, str] | None = None,
    ) -> list[tuple[str, datetime]]:
        # A shard left out is polled again next time: its sagas wake late, not never.
        plan = self.plan(partitions, partition_count)
        pages = await self.on_shards(
            plan,
            lambda n, s: s.due_wakeups(until, plan[n], partition_count, limit=limit, after=after),
        )
        merged = heapq.merge(*pages.values(), key=lambda pair: (as_utc(pair[1]), pair[0]))
        return list(itertools.islice(merged, max(limit, 0)))

    async def finished_before(
        self,
        cutoff: datetime,
        *,
        saga_types: Collection[str] | None = None,
        other_than: Collection[str] = (),
        partitions: Collection[int] | None = None,
        partition_count: int = 0,
        limit: int = 500,
    ) -> list[str]:
        plan = self.plan(partitions, partition_count)

        async def of_shard(name: str, store: EventStore) -> list[tuple[datetime, str]]:
            want = limit
            for _ in range(_RETENTION_ROUNDS):
                ids = await store.finished_before(
                    cutoff,
                    saga_types=saga_types,
                    other_than=other_than,
                    partitions=plan[name],
                    partition_count=partition_count,
                    limit=want,
                )
                kept = await self._removable(name, store, ids)
                if len(kept) >= limit or len(ids) < want:
                    break
                want *= 2
            return kept[:limit]

        found = await self.on_shards(plan, of_shard)
        merged = heapq.merge(*found.values())
        return [saga_id for _, saga_id in itertools.islice(merged, max(limit, 0))]

    async def _removable(
        self, name: str, store: EventStore, saga_ids: list[str]
    ) -> list[tuple[datetime, str]]:
        """(end, id) of the shard's candidates, oldest first, without the children whose
        parent lives on another shard and still exists there: the shard checked only its
        own sagas for parents (a parent may still undo or ask its child again)."""
        gate = asyncio.Semaphore(_LOOKUPS)

        async def one(saga_id: str) -> tuple[datetime, str] | None:
            async with gate:
                try:
                    head = await store.load_after(saga_id, 0, kinds=("saga_started",))
                except SagaNotFound:
                    return None  # removed meanwhile
            record = head.record
            if record.ended_at is None:
                return None  # reopened meanwhile
            first = head.events[0].event if head.events else None
            parent = first.parent if isinstance(first, SagaStarted) else None
            elsewhere = parent is not None and self.shard_map.shard_of_saga(parent.saga_id) != name
            if parent is not None and elsewhere and await self._exists(parent.saga_id):
                return None
            return (as_utc(record.ended_at), saga_id)

        found = await asyncio.gather(*(one(i) for i in saga_ids))
        return sorted(f for f in found if f is not None)

    async def _exists(self, saga_id: str) -> bool:
        """Whether the saga exists; True when its shard does not answer (kept, then)."""
        try:
            await self.get(saga_id)
        except SagaNotFound:
            return False
        except ShardUnavailable:
            return True
        return True

    # ----------------------------------------------------------------- retention

    async def histories(self, saga_ids: Collection[str]) -> list[LoadedSaga]:
        # Retention deletes the sagas it asked the histories of: a shard that does not
        # answer fails the read, never makes it short (its sagas would go unarchived).
        by_shard = self._by_shard(saga_ids)
        found = await self.on_shards(by_shard, lambda n, s: s.histories(by_shard[n]), partial=False)
        return list(heapq.merge(*found.values(), key=lambda h: h.record.saga_id))

    async def remove_finished(
        self, saga_ids: Collection[str], archive: Sequence[ArchivedSaga] = ()
    ) -> int:
        by_shard = self._by_shard(saga_ids)
        archived: dict[str, list[ArchivedSaga]] = {}
        for item in archive:
            archived.setdefault(self.shard_map.shard_of_saga(item.record.saga_id), []).append(item)
        names = [*by_shard, *(n for n in archived if n not in by_shard)]
        removed = await self.on_shards(
            names, lambda n, s: s.remove_finished(by_shard.get(n, []), archived.get(n, ()))
        )
        return sum(removed.values())

    def _by_shard(self, saga_ids: Collection[str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for saga_id in sorted(set(saga_ids)):
            out.setdefault(self.shard_map.shard_of_saga(saga_id), []).append(saga_id)
        return out

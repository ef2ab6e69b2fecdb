"""An in-memory event store for unit tests and the testing kit.

It keeps the same contract as the Postgres adapter, errors included, so code tested
against it behaves the same against Postgres. Values are copied through JSON on the
way in and out, as a database would, so callers cannot share mutable state with it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from saga_engine.core.history._codec import (
    CodecChain,
    PayloadCodec,
    Undecodable,
    open_event,
    seal_event,
)
from saga_engine.core.history._events import (
    Event,
    SagaStarted,
    event_from_json,
    event_to_dict,
    event_to_json,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.history._structs import to_data
from saga_engine.core.planning._rollout import InMemoryRollouts, RolloutRows
from saga_engine.kernel._errors import ConcurrencyError, SagaNotFound, SerializationError
from saga_engine.kernel._partitioning import partition_for
from saga_engine.kernel._serde import dumps, loads, unstorable
from saga_engine.store._meminsights import InMemoryInsights
from saga_engine.store._memkeys import InMemoryKeySlots
from saga_engine.store._store import (
    EVERY_SAGA,
    Append,
    ArchivedSaga,
    ListOrder,
    LoadedSaga,
    NewSaga,
    OpenSummary,
    Projection,
    RunSpan,
    SagaFilter,
    SagaRecord,
    StoredEvent,
    as_utc,
    check_lookup,
    check_new_saga_id,
    run_spans,
    wake_slot,
)


def _copy(
    event: Event, codec: CodecChain | None, undecodable: Undecodable = Undecodable.RAISE
) -> Event:
    """``event`` as the Postgres store writes it and reads it back: encoded once, as that
    store encodes it (``event_to_json``), refused where Postgres refuses it, decoded."""
    try:
        raw = event_to_json(event)
    except ValueError as exc:  # a string UTF-8 cannot carry (an unpaired surrogate)
        _refuse_unstorable(event)
        raise SerializationError(f"cannot serialize to JSON: {exc}") from exc
    if b"\\u0000" in raw:
        # Postgres's text and jsonb refuse a NUL character, which JSON writes \u0000.
        # The bytes only hint at it (an escaped backslash before "u0000" reads the
        # same): the walk decides.
        _refuse_unstorable(event)
    if codec is None:
        return event_from_json(raw)
    # Through the row a Postgres store writes, sealed, and back: the same codec path.
    return open_event(codec, loads(dumps(seal_event(codec, event_to_dict(event)))), undecodable)


def _refuse_unstorable(event: Event) -> None:
    """SerializationError naming the first place of ``event`` Postgres cannot store."""
    problems = unstorable(to_data(event))
    if problems:
        raise SerializationError(
            f"Postgres cannot store this value: {problems[0]['msg']} (at {problems[0]['loc']})"
        )


class InMemoryEventStore(InMemoryRollouts, InMemoryKeySlots, InMemoryInsights):
    def __init__(self, codec: PayloadCodec | CodecChain | None = None) -> None:
        self._rollouts = RolloutRows()
        self._codec = CodecChain.of(codec)
        self._records: dict[str, SagaRecord] = {}
        self._key_rows = {}
        self._events: dict[str, list[StoredEvent]] = {}
        #: Where each saga's runs after its first begin (its run_continued events).
        self._runs: dict[str, list[int]] = {}
        #: When each ended saga ended (the Postgres store's ended_at): retention's order.
        self._ended: dict[str, datetime] = {}
        #: (saga id, created at) -> gzipped export, as saga_archive's key.
        self._archive: dict[tuple[str, datetime], bytes] = {}
        self._insights = {}
        self._insights_pending = []
        # One lock makes each create/append atomic even if an adapter method awaits.
        self._lock = asyncio.Lock()
        self.closed = False

    def _now(self, events: list[Event]) -> datetime:
        return events[-1].at if events else datetime.now(UTC)

    async def create(self, new: NewSaga) -> bool:
        check_new_saga_id(new.saga_id)
        async with self._lock:
            if new.saga_id in self._records:
                return False
            events = [_copy(e, self._codec) for e in new.events]
            now = self._now(events)
            self._events[new.saga_id] = [StoredEvent(i + 1, e) for i, e in enumerate(events)]
            self._records[new.saga_id] = self._ends(
                SagaRecord(
                    saga_id=new.saga_id,
                    saga_type=new.saga_type,
                    status=new.projection.status,
                    last_seq=len(events),
                    created_at=now,
                    updated_at=now,
                    idempotency_key=new.idempotency_key,
                    search=dict(new.search) if new.search else None,
                    saga_version=new.saga_version,
                ),
                new.projection,
                len(events),
                now,
            )
            self._count_run(new.saga_id, self._events[new.saga_id])
            self._note_runs(new.saga_id, self._events[new.saga_id])
            return True

    async def append(self, append: Append) -> int:
        async with self._lock:
            record = self._records.get(append.saga_id)
            if record is None:
                raise SagaNotFound(append.saga_id)
            if record.last_seq != append.expected_seq:
                raise ConcurrencyError(append.saga_id, append.expected_seq, record.last_seq)
            events = [_copy(e, self._codec) for e in append.events]
            stored = self._events[append.saga_id]
            first = len(stored)
            for event in events:
                stored.append(StoredEvent(len(stored) + 1, event))
            self._count_run(append.saga_id, stored[first:])
            self._note_runs(append.saga_id, stored[first:])
            now = self._now(events) if events else record.updated_at
            self._records[append.saga_id] = self._ends(record, append.projection, len(stored), now)
            return len(stored)

    def _ends(self, record: SagaRecord, p: Projection, last_seq: int, now: datetime) -> SagaRecord:
        """The record with ``p`` applied, its end time kept while it stays ended."""
        if p.status.is_terminal:
            ended: datetime | None = self._ended.setdefault(record.saga_id, now)
        else:
            self._ended.pop(record.saga_id, None)
            ended = None
        return replace(
            record,
            status=p.status,
            current_step=p.current_step,
            next_wakeup=p.next_wakeup,
            error=p.error,
            last_seq=last_seq,
            updated_at=now,
            ended_at=ended,
        )

    async def load(
        self, saga_id: str, *, undecodable: Undecodable = Undecodable.RAISE
    ) -> LoadedSaga:
        record = await self.get(saga_id)
        return LoadedSaga(
            record,
            [
                StoredEvent(s.seq, _copy(s.event, self._codec, undecodable))
                for s in self._events[saga_id]
            ],
        )

    async def load_run(
        self, saga_id: str, *, undecodable: Undecodable = Undecodable.RAISE
    ) -> LoadedSaga:
        record = await self.get(saga_id)
        stored = self._events[saga_id]
        begins = self._run_starts(saga_id)[-1]
        picked = stored[:1] + stored[max(begins, 2) - 1 :]
        return LoadedSaga(
            record, [StoredEvent(s.seq, _copy(s.event, self._codec, undecodable)) for s in picked]
        )

    def _run_starts(self, saga_id: str) -> list[int]:
        """Where its runs begin (kept as events are stored, as Postgres keeps an index)."""
        return [1, *self._runs.get(saga_id, ())]

    def _note_runs(self, saga_id: str, stored: list[StoredEvent]) -> None:
        begun = [s.seq for s in stored if s.event.kind == "run_continued"]
        if begun:
            self._runs.setdefault(saga_id, []).extend(begun)

    async def runs(self, saga_id: str) -> list[RunSpan]:
        record = await self.get(saga_id)
        return run_spans(self._run_starts(saga_id)[1:], record.last_seq)

    async def load_after(
        self,
        saga_id: str,
        after_seq: int,
        *,
        kinds: Collection[str] | None = None,
        undecodable: Undecodable = Undecodable.RAISE,
    ) -> LoadedSaga:
        record = await self.get(saga_id)
        return LoadedSaga(
            record,
            [
                StoredEvent(s.seq, _copy(s.event, self._codec, undecodable))
                for s in self._events[saga_id][after_seq:]
                if kinds is None or s.event.kind in kinds
            ],
        )

    async def first_event(self, saga_id: str) -> StoredEvent:
        await self.get(saga_id)
        first = self._events[saga_id][0]
        return StoredEvent(first.seq, _copy(first.event, self._codec))

    async def get(self, saga_id: str) -> SagaRecord:
        check_lookup(saga_id)
        record = self._records.get(saga_id)
        if record is None:
            raise SagaNotFound(saga_id)
        return record

    async def list_sagas(
        self,
        where: SagaFilter = EVERY_SAGA,
        *,
        limit: int = 100,
        after_id: str | None = None,
        order: ListOrder = "id",
        after_activity: tuple[datetime, str] | None = None,
    ) -> list[SagaRecord]:
        rows = self._matching(where)
        if order == "activity":
            rows.sort(key=lambda r: (as_utc(r.activity_at), r.saga_id), reverse=True)
            if after_activity is not None:
                bound = (as_utc(after_activity[0]), after_activity[1])
                rows = [r for r in rows if (as_utc(r.activity_at), r.saga_id) < bound]
            return rows[:limit]
        rows.sort(key=lambda r: r.saga_id)
        return [r for r in rows if after_id is None or r.saga_id > after_id][:limit]

    async def count_by_status(
        self, where: SagaFilter = EVERY_SAGA, *, cap: int
    ) -> dict[SagaStatus, int]:
        counts = Counter(r.status for r in self._matching(where))
        return {status: min(n, cap) for status, n in counts.items()}

    def _matching(self, where: SagaFilter) -> list[SagaRecord]:
        """The records ``where`` matches, each with its parent filled in."""
        rows = (replace(r, parent_id=self._parent(r.saga_id)) for r in self._records.values())
        return [r for r in rows if where.matches(r)]

    def _parent(self, saga_id: str) -> str | None:
        """The saga that started this one as a child (its first event says)."""
        first = self._events[saga_id][0].event
        parent = first.parent if isinstance(first, SagaStarted) else None
        return parent.saga_id if parent is not None else None

    async def open_saga_ids(
        self, partitions: Collection[int] | None = None, partition_count: int = 0
    ) -> list[str]:
        return sorted(
            r.saga_id
            for r in self._records.values()
            if r.status.is_open
            and (partitions is None or partition_for(r.saga_id, partition_count) in partitions)
        )

    async def due_wakeups(
        self,
        until: datetime,
        partitions: Collection[int] | None = None,
        partition_count: int = 0,
        limit: int = 1000,
        after: tuple[datetime, str] | None = None,
    ) -> list[tuple[str, datetime]]:
        slots = (
            (slot, r)
            for r in self._records.values()
            if (slot := wake_slot(r.next_wakeup)) is not None
            and r.status is not SagaStatus.NONDETERMINISTIC
        )
        due = sorted(
            (slot, r.saga_id)
            for slot, r in slots
            if slot <= as_utc(until)
            and (after is None or (slot, r.saga_id) > (as_utc(after[0]), after[1]))
            and (partitions is None or partition_for(r.saga_id, partition_count) in partitions)
        )
        return [(saga_id, at) for at, saga_id in due[:limit]]

    async def open_summary(self) -> OpenSummary:
        by_status: Counter[SagaStatus] = Counter()
        parked: list[datetime] = []
        for r in self._records.values():
            if r.status.is_open:
                by_status[r.status] += 1
            if r.status.is_parked:
                parked.append(as_utc(r.updated_at))
        return OpenSummary(dict(by_status), min(parked, default=None))

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
        found = sorted(
            (as_utc(self._ended[r.saga_id]), r.saga_id)
            for r in self._records.values()
            if r.status.is_terminal
            and as_utc(self._ended[r.saga_id]) < as_utc(cutoff)
            and (saga_types is None or r.saga_type in saga_types)
            and r.saga_type not in other_than
            and (partitions is None or partition_for(r.saga_id, partition_count) in partitions)
            and not self._parent_kept(r.saga_id)
        )
        return [saga_id for _, saga_id in found[:limit]]

    def _parent_kept(self, saga_id: str) -> bool:
        """A child stays while its parent does (see the Postgres store's retention)."""
        parent = self._parent(saga_id)
        return parent is not None and parent in self._records

    async def histories(self, saga_ids: Collection[str]) -> list[LoadedSaga]:
        return [await self.load(i) for i in sorted(set(saga_ids)) if i in self._records]

    async def remove_finished(
        self, saga_ids: Collection[str], archive: Sequence[ArchivedSaga] = ()
    ) -> int:
        for item in archive:
            key = (item.record.saga_id, as_utc(item.record.created_at))
            self._archive.setdefault(key, item.history)
        gone = [
            i for i in set(saga_ids) if i in self._records and self._records[i].status.is_terminal
        ]
        for saga_id in gone:
            del self._records[saga_id]
            self._events.pop(saga_id, None)
            self._runs.pop(saga_id, None)
            self._ended.pop(saga_id, None)
        return len(gone)

    async def archived_history(self, saga_id: str) -> bytes | None:
        mine = sorted((at, blob) for (i, at), blob in self._archive.items() if i == saga_id)
        return mine[-1][1] if mine else None

    async def close(self) -> None:
        self.closed = True

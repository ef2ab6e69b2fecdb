"""The event-store port: what the engine needs from durable storage.

Two adapters implement it: ``PostgresEventStore`` (asyncpg, in ``_pgstore``) and
``InMemoryEventStore`` (``_memstore``). One contract suite (tests/internal/contract) runs against
both, and both raise the same errors:

- ``ConcurrencyError`` when an append's ``expected_seq`` is not the saga's last sequence;
- ``SagaNotFound`` when the saga does not exist.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Final, Literal, Protocol, runtime_checkable

from saga_engine.core.history._codec import Undecodable
from saga_engine.core.history._decision import Projection as Projection
from saga_engine.core.history._events import Event
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import InvalidSagaId, SagaNotFound
from saga_engine.kernel._serde import JsonDict

#: The timer poller's slot: a saga is found by its wake-up rounded down to this
#: (``wake_slot``), so that the steps of a saga, each moving its wake-up by a few
#: milliseconds, leave the stored slot (an indexed column) as it was, and its row's
#: update stays off the indexes (migration 0010). A saga is found at most this early.
WAKE_GRID: Final = timedelta(seconds=5)
_GRID_S: Final = int(WAKE_GRID.total_seconds())


def wake_slot(at: datetime | None) -> datetime | None:
    """``at`` rounded down to ``WAKE_GRID`` (as Postgres's ``date_bin`` from 2000-01-01
    UTC, a multiple of the grid after the epoch): never later than ``at``."""
    if at is None:
        return None
    at = as_utc(at)
    whole = math.floor(at.timestamp()) // _GRID_S * _GRID_S
    return datetime.fromtimestamp(whole, UTC)


#: The longest saga id a store holds (the ``sagas`` table's CHECK constraint).
MAX_SAGA_ID_LENGTH: Final = 200


def check_new_saga_id(saga_id: str) -> None:
    """InvalidSagaId for an id no store can hold (the stores' create checks this)."""
    if not 1 <= len(saga_id) <= MAX_SAGA_ID_LENGTH:
        raise InvalidSagaId(
            f"a saga id must be 1 to {MAX_SAGA_ID_LENGTH} characters long, not {len(saga_id)}"
        )


def check_lookup(saga_id: str) -> None:
    """SagaNotFound for an id no store can hold: too long, empty, or with a NUL character
    (Postgres would refuse the NUL with an error about encodings instead)."""
    if not 1 <= len(saga_id) <= MAX_SAGA_ID_LENGTH or "\x00" in saga_id:
        raise SagaNotFound(saga_id[:MAX_SAGA_ID_LENGTH].replace("\x00", "\\x00"))


def as_utc(value: datetime) -> datetime:
    """A naive datetime taken as UTC, as the stores and the admin API read them."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


@dataclass(frozen=True, slots=True)
class SagaRecord:
    saga_id: str
    saga_type: str
    status: SagaStatus
    last_seq: int
    created_at: datetime
    updated_at: datetime
    current_step: str | None = None
    next_wakeup: datetime | None = None
    error: JsonDict | None = None
    idempotency_key: str | None = None
    #: Its type's declared business keys (``Saga.search_attributes``), as strings.
    search: dict[str, str] | None = None
    #: The version of its type it runs (``Saga.version``, chosen by the rollout).
    saga_version: int = 1
    #: When it ended (set while it is in a terminal status, None otherwise).
    ended_at: datetime | None = None
    #: The saga that started it as a child: filled by ``list_sagas`` only (read from
    #: its first event there), None elsewhere.
    parent_id: str | None = None

    @property
    def activity_at(self) -> datetime:
        """Its last activity, the listing's default order: when it ended, or for an
        open saga when its row last changed."""
        return self.ended_at if self.ended_at is not None else self.updated_at


#: The listing's orders: ``id`` ascending, or ``activity`` (``activity_at``, then id)
#: newest first.
ListOrder = Literal["id", "activity"]


@dataclass(frozen=True, slots=True)
class SagaFilter:
    """Which sagas a listing or a count takes (``EventStore.list_sagas``,
    ``count_by_status``): every filter given must match. Time bounds: ``*_after``
    inclusive, ``*_before`` exclusive (naive: UTC)."""

    statuses: frozenset[SagaStatus] | None = None
    saga_type: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    #: A saga whose id starts with it, or whose idempotency key is it.
    search: str | None = None
    #: Search attributes (``Saga.search_attributes``), each of which must match exactly.
    attributes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Only sagas no other saga started (``ctx.child``): children left out.
    roots_only: bool = False

    def __post_init__(self) -> None:
        # Frozen all the way down: the caller's collections are copied, read-only.
        if self.statuses is not None:
            object.__setattr__(self, "statuses", frozenset(map(SagaStatus, self.statuses)))
        object.__setattr__(self, "attributes", MappingProxyType(dict(self.attributes)))

    def matches(self, record: SagaRecord) -> bool:
        """The filter's rule, for a store that filters in Python (the in-memory one);
        ``roots_only`` reads ``record.parent_id``, which the caller fills."""
        created, updated = as_utc(record.created_at), as_utc(record.updated_at)
        search = self.search
        return (
            (self.statuses is None or record.status in self.statuses)
            and (self.saga_type is None or record.saga_type == self.saga_type)
            and _within(created, self.created_after, self.created_before)
            and _within(updated, self.updated_after, self.updated_before)
            and (
                search is None
                or record.saga_id.startswith(search)
                or record.idempotency_key == search
            )
            and self.attributes.items() <= (record.search or {}).items()
            and (not self.roots_only or record.parent_id is None)
        )


def _within(at: datetime, after: datetime | None, before: datetime | None) -> bool:
    return (after is None or at >= as_utc(after)) and (before is None or at < as_utc(before))


#: The filter that matches every saga.
EVERY_SAGA: Final = SagaFilter()


@dataclass(frozen=True, slots=True)
class OpenSummary:
    """What ``/metrics`` reports of the store: open sagas by status (a status with none
    may be missing), and when the longest-parked saga last changed."""

    by_status: dict[SagaStatus, int]
    oldest_parked_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ArchivedSaga:
    """A finished saga as retention archives it in the store: its record, and its
    history as the gzip of its export (``saga_engine.replay.export_history``)."""

    record: SagaRecord
    history: bytes


@dataclass(frozen=True, slots=True)
class StoredEvent:
    seq: int
    event: Event


@dataclass(frozen=True, slots=True)
class NewSaga:
    """A saga's first events. Sequence numbers start at 1."""

    saga_id: str
    saga_type: str
    events: Sequence[Event]
    projection: Projection
    idempotency_key: str | None = None
    #: Search attributes (``Saga.search_attributes``): written with the saga's row.
    search: Mapping[str, str] | None = None
    #: The version of its type it runs (its ``saga_started`` records it too).
    saga_version: int = 1


@dataclass(frozen=True, slots=True)
class Append:
    """Events to add after ``expected_seq``, which must be the saga's last sequence."""

    saga_id: str
    expected_seq: int
    events: Sequence[Event]
    projection: Projection


@dataclass(frozen=True, slots=True)
class RunSpan:
    """One run of a saga (``ctx.continue_as_new``): its number (the first is 1), the
    sequence number of its first event, and how many events it has."""

    run: int
    first_seq: int
    events: int


def run_spans(continued_seqs: Sequence[int], last_seq: int) -> list[RunSpan]:
    """The runs of a saga whose ``run_continued`` events are at ``continued_seqs`` (in
    order), its history ending at ``last_seq``."""
    starts = [1, *continued_seqs]
    ends = [*(seq - 1 for seq in continued_seqs), last_seq]
    return [RunSpan(i + 1, a, b - a + 1) for i, (a, b) in enumerate(zip(starts, ends, strict=True))]


@dataclass(frozen=True, slots=True)
class LoadedSaga:
    record: SagaRecord
    events: list[StoredEvent] = field(default_factory=list)


@runtime_checkable
class EventStore(Protocol):
    async def create(self, new: NewSaga) -> bool:
        """Stores a new saga. Returns False, changing nothing, if the id already exists."""
        ...

    async def append(self, append: Append) -> int:
        """Appends events atomically and returns the new last sequence.

        Raises ConcurrencyError if ``expected_seq`` is stale, SagaNotFound if the saga
        does not exist. Either every event is stored or none is.
        """
        ...

    async def load(
        self, saga_id: str, *, undecodable: Undecodable = Undecodable.RAISE
    ) -> LoadedSaga:
        """The saga's record and its whole history, in sequence order.

        A payload sealed by a codec is decoded; one the store cannot decode raises
        CodecError, or with ``Undecodable.SHOW`` (operators' reads) is shown as
        ``{"$encrypted": {...}}``."""
        ...

    async def load_run(
        self, saga_id: str, *, undecodable: Undecodable = Undecodable.RAISE
    ) -> LoadedSaga:
        """The saga's record and its current run: its ``saga_started``, then its events
        from its latest ``run_continued`` on (the whole history for a saga that never
        continued as new). What the engine drives a saga from: one run, however long the
        saga has lived (``ctx.continue_as_new``)."""
        ...

    async def runs(self, saga_id: str) -> list[RunSpan]:
        """The saga's runs, first to current: where each begins and how many events it
        has. Raises SagaNotFound."""
        ...

    async def load_after(
        self,
        saga_id: str,
        after_seq: int,
        *,
        kinds: Collection[str] | None = None,
        undecodable: Undecodable = Undecodable.RAISE,
    ) -> LoadedSaga:
        """The saga's record and the events after ``after_seq`` up to its ``last_seq``, of
        ``kinds`` only when given (the same read as ``load``, from a point on: a reader
        following a saga reads what is new, not its whole history again)."""
        ...

    async def first_event(self, saga_id: str) -> StoredEvent:
        """The saga's first event (its ``saga_started``), without reading the rest of the
        history. Raises SagaNotFound if the saga does not exist."""
        ...

    async def get(self, saga_id: str) -> SagaRecord: ...

    async def list_sagas(
        self,
        where: SagaFilter = EVERY_SAGA,
        *,
        limit: int = 100,
        after_id: str | None = None,
        order: ListOrder = "id",
        after_activity: tuple[datetime, str] | None = None,
    ) -> list[SagaRecord]:
        """The sagas ``where`` matches, ordered by id; ``after_id`` is the page cursor.

        ``order="activity"``: newest ``activity_at`` first, ties by id descending, paged
        by ``after_activity`` (the last row's ``(activity_at, saga_id)``; ``after_id`` is
        then ignored)."""
        ...

    async def count_by_status(
        self, where: SagaFilter = EVERY_SAGA, *, cap: int
    ) -> dict[SagaStatus, int]:
        """How many sagas ``where`` matches, per status, each count stopping at ``cap`` (a
        count of ``cap`` means at least that many). A status no saga has is missing."""
        ...

    async def open_saga_ids(
        self, partitions: Collection[int] | None = None, partition_count: int = 0
    ) -> list[str]:
        """Ids of every saga not in a terminal status (for recovery), in id order; with
        ``partitions``, only those whose key Kafka puts in one of them, of
        ``partition_count``."""
        ...

    async def open_summary(self) -> OpenSummary:
        """Open sagas by status, and the oldest parked one's last change."""
        ...

    async def due_wakeups(
        self,
        until: datetime,
        partitions: Collection[int] | None = None,
        partition_count: int = 0,
        limit: int = 1000,
        after: tuple[datetime, str] | None = None,
    ) -> list[tuple[str, datetime]]:
        """(saga id, wake slot) of the sagas whose next wake-up's slot (``wake_slot``:
        rounded down to ``WAKE_GRID``) is at or before ``until``, soonest first (then by
        id), at most ``limit``, after the ``after`` cursor (the last pair of the previous
        page); with ``partitions``, only those keyed to them (as in ``open_saga_ids``).
        A saga is found up to ``WAKE_GRID`` before it is due."""
        ...

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
        """Ids of finished sagas whose last change is before ``cutoff``, oldest first:
        of ``saga_types`` only if given, never of ``other_than``; with ``partitions``,
        only those keyed to them (a saga created before migration 0004 counts as
        partition 0's)."""
        ...

    async def histories(self, saga_ids: Collection[str]) -> list[LoadedSaga]:
        """The records and histories of the sagas that exist among ``saga_ids``."""
        ...

    async def remove_finished(
        self, saga_ids: Collection[str], archive: Sequence[ArchivedSaga] = ()
    ) -> int:
        """Deletes the finished sagas among ``saga_ids`` and their histories, writing
        ``archive`` (kept if already there) in the same transaction. An open saga is
        never deleted. Returns how many sagas were deleted."""
        ...

    async def archived_history(self, saga_id: str) -> bytes | None:
        """The gzipped export of an archived saga, or None."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class FollowsShardMap(Protocol):
    """A store routed by a shard map that a move changes (``ShardedEventStore``): the
    worker asks it to read the map in force every ``engine.rollout_refresh_s``."""

    async def refresh_map(self, *, known: int | None = None) -> bool:
        """Routes by the map in force if it is newer than ``known`` (the current
        epoch by default); whether it is."""
        ...

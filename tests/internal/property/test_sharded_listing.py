"""The sharded store's merged listing equals one store's (issue 43).

The same generated sagas (ids, types, statuses, parents, when they started and last
moved) go into one in-memory store and into a sharded store of two or three in-memory
shards under a generated shard map. Then, for generated filters and page sizes, every
page of ``list_sagas`` in both orders, walking its cursor to the end, and
``count_by_status`` under a generated cap are the same from both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from saga_engine.core.history._events import ParentLink, SagaStarted, TimerFired
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._partitioning import partition_for
from saga_engine.kernel._shards import ShardMap
from saga_engine.store._memstore import InMemoryEventStore
from saga_engine.store._shard_router import ShardOpener
from saga_engine.store._sharded import ShardedEventStore
from saga_engine.store._store import (
    Append,
    EventStore,
    ListOrder,
    NewSaga,
    Projection,
    SagaFilter,
    SagaRecord,
)

T0 = datetime(2030, 1, 1, tzinfo=UTC)
PARTITIONS = 12
TYPES = ("order", "payment", "trip")


@dataclass(frozen=True)
class Planned:
    saga_id: str
    saga_type: str
    status: SagaStatus
    #: Minutes after T0 it started; a later event moves it (and ends it if it ends).
    started: int
    moved: int | None
    parent: int | None  # index of an earlier saga that started it
    #: Minutes after T0 of its next wake-up, if it has one.
    wake: int | None = None


# Ids from a small alphabet (ties of prefixes, upper before lower, a non-ASCII letter)
# so that filters by prefix and the byte order of ids both matter.
ids = st.text(alphabet="aAb_-1ä", min_size=1, max_size=4)


@st.composite
def worlds(draw: st.DrawFn) -> list[Planned]:
    saga_ids = draw(st.lists(ids, min_size=0, max_size=30, unique=True))
    out: list[Planned] = []
    for n, saga_id in enumerate(saga_ids):
        # Few distinct minutes: many ties of activity between sagas (and shards).
        started = draw(st.integers(0, 5))
        moved = draw(st.none() | st.integers(started, 7))
        parent = draw(st.none() | st.integers(0, n - 1)) if n else None
        out.append(
            Planned(
                saga_id,
                draw(st.sampled_from(TYPES)),
                draw(st.sampled_from(list(SagaStatus))),
                started,
                moved,
                parent,
                draw(st.none() | st.integers(0, 8)),
            )
        )
    return out


@st.composite
def shard_maps(draw: st.DrawFn) -> ShardMap:
    names = ("a", "b", "c")[: draw(st.integers(2, 3))]
    owners = draw(st.lists(st.sampled_from(names), min_size=PARTITIONS, max_size=PARTITIONS))
    ranges = {n: ",".join(str(p) for p, o in enumerate(owners) if o == n) for n in names}
    return ShardMap.build(ranges, PARTITIONS)


@st.composite
def filters(draw: st.DrawFn) -> SagaFilter:
    statuses = draw(st.none() | st.frozensets(st.sampled_from(list(SagaStatus)), max_size=4))
    return SagaFilter(
        statuses=statuses,
        saga_type=draw(st.none() | st.sampled_from(TYPES)),
        created_after=draw(st.none() | st.integers(0, 6).map(_at)),
        updated_before=draw(st.none() | st.integers(0, 8).map(_at)),
        search=draw(st.none() | ids),
        roots_only=draw(st.booleans()),
    )


def _at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


async def _fill(store: EventStore, world: Sequence[Planned]) -> None:
    for saga in world:
        parent = world[saga.parent].saga_id if saga.parent is not None else None
        link = ParentLink(saga_id=parent, command_id="c") if parent is not None else None
        started = SagaStarted(at=_at(saga.started), saga_type=saga.saga_type, input={}, parent=link)
        wake = _at(saga.wake) if saga.wake is not None else None
        first = SagaStatus.RUNNING if saga.moved is not None else saga.status
        new = NewSaga(saga.saga_id, saga.saga_type, [started], Projection(first, next_wakeup=wake))
        assert await store.create(new)
        if saga.moved is not None:
            fired = TimerFired(at=_at(saga.moved), timer_id="t")
            last = Projection(saga.status, next_wakeup=wake)
            await store.append(Append(saga.saga_id, 1, [fired], last))


def _sharded(shard_map: ShardMap) -> ShardedEventStore:
    def opener() -> ShardOpener:
        store = InMemoryEventStore()

        async def opened() -> EventStore:
            return store

        return opened

    return ShardedEventStore(shard_map, {name: opener() for name in shard_map.names})


async def _pages(
    store: EventStore, where: SagaFilter, order: ListOrder, limit: int
) -> list[list[SagaRecord]]:
    """Every page, the cursor walked to the end (as the admin API walks it)."""
    pages: list[list[SagaRecord]] = []
    after_id: str | None = None
    after_activity: tuple[datetime, str] | None = None
    while True:
        page = await store.list_sagas(
            where, limit=limit, after_id=after_id, order=order, after_activity=after_activity
        )
        pages.append(page)
        if len(page) < limit:
            return pages
        last = page[-1]
        after_id, after_activity = last.saga_id, (last.activity_at, last.saga_id)


@settings(max_examples=200, deadline=None)
@given(
    worlds(),
    shard_maps(),
    st.lists(st.tuples(filters(), st.integers(1, 6), st.integers(1, 8)), min_size=1, max_size=4),
)
def test_the_merged_listing_and_counts_equal_one_stores(
    world: list[Planned], shard_map: ShardMap, asks: list[tuple[SagaFilter, int, int]]
) -> None:
    asyncio.run(_compare(world, shard_map, asks))


async def _compare(
    world: list[Planned], shard_map: ShardMap, asks: list[tuple[SagaFilter, int, int]]
) -> None:
    one = InMemoryEventStore()
    sharded = _sharded(shard_map)
    await _fill(one, world)
    await _fill(sharded, world)
    for where, limit, cap in asks:
        for order in ("id", "activity"):
            assert await _pages(sharded, where, order, limit) == await _pages(
                one, where, order, limit
            )
        assert await sharded.count_by_status(where, cap=cap) == await one.count_by_status(
            where, cap=cap
        )
    # Each shard holds the sagas of its partitions, and only those.
    held = 0
    for name in shard_map.names:
        rows = await (await sharded.shard(name)).list_sagas(limit=100)
        assert all(shard_map.shard_of_saga(r.saga_id) == name for r in rows)
        held += len(rows)
    assert held == len(world)


@settings(max_examples=200, deadline=None)
@given(
    worlds(),
    shard_maps(),
    st.none() | st.frozensets(st.integers(0, PARTITIONS - 1)),
    st.integers(1, 8),
    st.integers(0, 9),
)
def test_reads_by_partition_equal_one_stores(
    world: list[Planned],
    shard_map: ShardMap,
    partitions: frozenset[int] | None,
    limit: int,
    minutes: int,
) -> None:
    """Recovery's open sagas, the timer poller's wake-ups (paged) and retention's
    candidates (a child kept while its parent exists, on whichever shard): the same."""
    asyncio.run(_compare_partitions(world, shard_map, partitions, limit, _at(minutes)))


async def _compare_partitions(
    world: list[Planned],
    shard_map: ShardMap,
    partitions: frozenset[int] | None,
    limit: int,
    until: datetime,
) -> None:
    one = InMemoryEventStore()
    sharded = _sharded(shard_map)
    await _fill(one, world)
    await _fill(sharded, world)
    stores: tuple[EventStore, EventStore] = (one, sharded)
    open_ids = [await s.open_saga_ids(partitions, PARTITIONS) for s in stores]
    assert open_ids[0] == open_ids[1]
    candidates = [
        await s.finished_before(
            until, partitions=partitions, partition_count=PARTITIONS, limit=limit
        )
        for s in stores
    ]
    assert candidates[0] == candidates[1]
    for s in stores:  # paged as the poller pages
        after: tuple[datetime, str] | None = None
        pages = []
        while page := await s.due_wakeups(until, partitions, PARTITIONS, limit=limit, after=after):
            pages.append(page)
            after = (page[-1][1], page[-1][0])
        if s is one:
            expected = pages
        else:
            assert pages == expected
    if partitions is not None:
        assert all(partition_for(i, PARTITIONS) in partitions for i in open_ids[1])

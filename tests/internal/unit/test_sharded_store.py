"""The sharded store (store/_sharded, issue 43) over in-memory shards: which shards a call
reaches, what a shard that does not answer does to it, and what lives across shards
(a parent and its child, a key and the sagas holding it).

The contract suite (tests/internal/contract) holds it to one store's answers; the
property test (tests/internal/property/test_sharded_listing.py) its merged listing."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from saga_engine.core.history._events import ParentLink, SagaCompleted, SagaStarted
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import ShardMapError, ShardUnavailable, StoreUnavailable
from saga_engine.kernel._partitioning import partition_for
from saga_engine.kernel._shards import ShardMap
from saga_engine.store._coverage import coverage
from saga_engine.store._memstore import InMemoryEventStore
from saga_engine.store._shard_router import ShardOpener
from saga_engine.store._sharded import ShardedEventStore
from saga_engine.store._store import Append, EventStore, NewSaga, Projection, SagaFilter
from saga_engine.telemetry._health import HealthBoard

MAP = ShardMap.build({"a": "0-3", "b": "4-7"}, 8)
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ids_of(shard: str, n: int, prefix: str = "s") -> list[str]:
    """``n`` saga ids that ``MAP`` puts in ``shard``."""
    found = (f"{prefix}-{i}" for i in itertools.count())
    return list(itertools.islice((i for i in found if MAP.shard_of_saga(i) == shard), n))


class Down:
    """A shard's store whose server does not answer: every call raises as asyncpg's
    refused connection does (an OSError), untranslated."""

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise ConnectionRefusedError(111, f"connection refused ({name})")

        return refused


class Shards:
    """In-memory shards and what was opened, how many times."""

    def __init__(self, *, down: frozenset[str] = frozenset()) -> None:
        self.stores = {n: InMemoryEventStore() for n in MAP.names}
        self.down = set(down)
        self.opens: list[str] = []

    def opener(self, name: str) -> ShardOpener:
        async def opened() -> EventStore:
            self.opens.append(name)
            await asyncio.sleep(0)  # others asking meanwhile wait for this open
            if name in self.down:
                return Down()  # type: ignore[return-value]
            return self.stores[name]

        return opened

    def sharded(self) -> ShardedEventStore:
        return ShardedEventStore(MAP, {n: self.opener(n) for n in MAP.names})


def new(saga_id: str, status: SagaStatus = SagaStatus.RUNNING, **kw: Any) -> NewSaga:
    wake = kw.pop("wake", None)
    started = SagaStarted(at=kw.pop("at", T0), saga_type="order", input={}, **kw)
    return NewSaga(saga_id, "order", [started], Projection(status, next_wakeup=wake))


async def test_a_map_and_stores_that_disagree_are_refused() -> None:
    shards = Shards()
    with pytest.raises(ShardMapError, match="no store for b"):
        ShardedEventStore(MAP, {"a": shards.opener("a")})
    with pytest.raises(ShardMapError, match="does not name: c"):
        ShardedEventStore(
            MAP, {**{n: shards.opener(n) for n in MAP.names}, "c": shards.opener("a")}
        )


async def test_a_sagas_operations_go_to_its_shard_and_open_only_it() -> None:
    shards = Shards()
    store = shards.sharded()
    [saga] = ids_of("a", 1)
    assert await store.create(new(saga))
    assert store.opened == ("a",)
    completed = Append(saga, 1, [SagaCompleted(at=T0, output={})], Projection(SagaStatus.COMPLETED))
    assert await store.append(completed) == 2
    assert [e.seq for e in (await store.load(saga)).events] == [1, 2]
    assert (await store.get(saga)).status is SagaStatus.COMPLETED
    assert (await shards.stores["a"].get(saga)).last_seq == 2
    assert await shards.stores["b"].list_sagas() == []
    # Reads of shard a's partitions only: b is still not opened.
    mine = {p for p in range(8) if MAP.shard_of_partition(p) == "a"}
    assert await store.open_saga_ids(mine, 8) == []
    assert await store.due_wakeups(T0, mine, 8) == []
    assert store.opened == ("a",)
    # A read of every saga opens the others.
    assert [r.saga_id for r in await store.list_sagas()] == [saga]
    assert list(store.opened) == ["a", "b"]
    assert shards.opens == ["a", "b"]
    await store.close()
    assert shards.stores["a"].closed
    assert shards.stores["b"].closed
    with pytest.raises(ShardUnavailable, match="closed"):
        await store.get(saga)


async def test_concurrent_first_uses_open_a_shard_once() -> None:
    shards = Shards()
    store = shards.sharded()
    sagas = ids_of("b", 5)
    assert all(await asyncio.gather(*(store.create(new(i)) for i in sagas)))
    assert shards.opens == ["b"]
    await store.close()
    assert not shards.stores["a"].closed  # never opened, never closed


async def test_a_shard_that_cannot_be_opened_is_unavailable_then_opened_when_it_can() -> None:
    shards = Shards()
    tries = 0

    async def flaky() -> EventStore:
        nonlocal tries
        tries += 1
        if tries == 1:
            raise StoreUnavailable("Postgres is unavailable: ConnectionRefusedError")
        return shards.stores["b"]

    health = HealthBoard()
    store = ShardedEventStore(MAP, {"a": shards.opener("a"), "b": flaky}, health=health)
    [saga] = ids_of("b", 1)
    with pytest.raises(ShardUnavailable) as refused:
        await store.create(new(saga))
    assert refused.value.shard == "b"
    assert "ConnectionRefusedError" in str(refused.value)
    # /health is degraded, naming the shard, until a call to it succeeds.
    assert health.status == "degraded"
    assert ["shard 'b'" in p for p in health.problems] == [True]
    await store.create(new(ids_of("a", 1)[0]))
    assert health.status == "degraded"
    assert await store.create(new(saga))
    assert tries == 2
    assert health.status == "ok"


async def test_a_shard_down_fails_its_sagas_and_leaves_the_rest_of_a_read() -> None:
    shards = Shards(down=frozenset({"b"}))
    store = shards.sharded()
    on_a, on_b = ids_of("a", 3), ids_of("b", 1)
    for saga in on_a:
        assert await store.create(new(saga, wake=T0))
    # Every operation of a saga of b: ShardUnavailable naming b, never another error.
    [lost] = on_b
    for call in (
        store.create(new(lost)),
        store.append(Append(lost, 1, [], Projection(SagaStatus.RUNNING))),
        store.load(lost),
        store.load_run(lost),
        store.runs(lost),
        store.load_after(lost, 0),
        store.first_event(lost),
        store.get(lost),
        store.archived_history(lost),
        store.histories([lost, on_a[0]]),
        store.open_saga_ids(),  # recovery acts on all of it: it must be whole
    ):
        with pytest.raises(ShardUnavailable) as refused:
            await call
        assert refused.value.shard == "b"
        assert "connection refused" in str(refused.value)
    # A read of every saga: a's answer, and b named as missing.
    with coverage() as seen:
        assert [r.saga_id for r in await store.list_sagas()] == sorted(on_a)
        assert [r.saga_id for r in await store.list_sagas(order="activity")] == sorted(
            on_a, reverse=True
        )
        assert await store.count_by_status(cap=10) == {SagaStatus.RUNNING: 3}
        assert (await store.open_summary()).by_status == {SagaStatus.RUNNING: 3}
        assert [i for i, _ in await store.due_wakeups(T0)] == sorted(on_a)
        assert await store.finished_before(T0 + timedelta(days=1)) == []
        assert await store.remove_finished([on_a[0], lost]) == 0
        assert await store.roll_up_insights() == 0
    assert set(seen.missing) == {"b"}
    assert "connection refused" in seen.missing["b"]
    assert [h.record.saga_id for h in await store.histories(on_a)] == sorted(on_a)


async def test_when_every_shard_is_down_a_read_fails_naming_them() -> None:
    store = Shards(down=frozenset(MAP.names)).sharded()
    with coverage() as seen, pytest.raises(ShardUnavailable) as refused:
        await store.list_sagas()
    assert refused.value.shard == "a, b"
    assert not seen.partial  # nothing answered: an error, not a partial answer


async def test_reads_by_partition_ask_the_shards_of_those_partitions_only() -> None:
    shards = Shards(down=frozenset({"b"}))
    store = shards.sharded()
    sagas = ids_of("a", 4)
    for saga in sagas:
        assert await store.create(new(saga, wake=T0))
    first = {partition_for(sagas[0], 8)}
    assert await store.open_saga_ids(first, 8) == [i for i in sagas if partition_for(i, 8) in first]
    with coverage() as seen:
        due = await store.due_wakeups(T0, range(4), 8, limit=2)
    assert due == [(i, T0) for i in sorted(sagas)[:2]]
    assert not seen.partial  # b holds none of them: it was not asked
    assert store.opened == ("a",)


async def test_retention_keeps_a_child_while_its_parent_lives_on_another_shard() -> None:
    store = Shards().sharded()
    [parent] = ids_of("a", 1, "parent")
    [child, orphan] = ids_of("b", 2, "child")
    assert await store.create(new(parent))
    link = ParentLink(saga_id=parent, command_id="c-1")
    assert await store.create(new(child, SagaStatus.COMPLETED, parent=link))
    gone = ParentLink(saga_id="never-was", command_id="c-2")
    assert await store.create(
        new(orphan, SagaStatus.COMPLETED, parent=gone, at=T0 + timedelta(seconds=1))
    )
    cutoff = T0 + timedelta(days=30)
    # Shard b alone would take both: its own rows know nothing of a's parent.
    assert await (await store.shard("b")).finished_before(cutoff) == [child, orphan]
    assert await store.finished_before(cutoff) == [orphan]
    done = Append(parent, 1, [SagaCompleted(at=T0, output={})], Projection(SagaStatus.COMPLETED))
    assert await store.append(done) == 2
    assert await store.finished_before(cutoff) == [parent, orphan]  # oldest first
    assert await store.remove_finished([parent]) == 1
    assert await store.finished_before(cutoff) == [child, orphan]


async def test_retention_reads_past_a_batch_of_kept_children() -> None:
    store = Shards().sharded()
    [parent] = ids_of("a", 1, "parent")
    children = ids_of("b", 5, "child")
    assert await store.create(new(parent))
    link = ParentLink(saga_id=parent, command_id="c")
    for child in children:
        assert await store.create(new(child, SagaStatus.COMPLETED, parent=link))
    [done] = ids_of("b", 1, "late")
    assert await store.create(new(done, SagaStatus.COMPLETED, at=T0 + timedelta(hours=1)))
    assert await store.finished_before(T0 + timedelta(days=1), limit=2) == [done]


async def test_a_keys_slots_live_in_its_keys_shard_and_the_sweep_finds_sagas_elsewhere() -> None:
    shards = Shards()
    store = shards.sharded()
    key = ids_of("a", 1, "acct")[0]
    holder, waiter = ids_of("b", 2)
    for saga in (holder, waiter):
        assert await store.create(new(saga))
    assert (await store.acquire_key("order", key, holder, 1, T0)).held
    assert (await store.acquire_key("order", key, waiter, 1, T0)).position == 1
    assert [s.saga_id for s in await shards.stores["a"].key_slots()] == [holder, waiter]
    assert await shards.stores["b"].key_slots() == []
    # Shard a's own sweep would take the holder (not in a) for gone; across shards it is
    # open, and stays.
    assert await store.sweep_keys(T0) == []
    assert [s.saga_id for s in await store.key_slots(key=key)] == [holder, waiter]
    ended = Append(holder, 1, [SagaCompleted(at=T0, output={})], Projection(SagaStatus.COMPLETED))
    assert await store.append(ended) == 2
    assert await store.sweep_keys(T0) == [waiter]
    [slot] = await store.key_slots("order")
    assert (slot.saga_id, slot.held) == (waiter, True)
    assert await store.release_key(waiter, T0) == []
    assert await store.key_slots() == []


async def test_insights_add_up_across_shards() -> None:
    store = Shards().sharded()
    # Ending one after the other, alternately on each shard.
    sagas = [i for pair in zip(ids_of("a", 3), ids_of("b", 3), strict=True) for i in pair]
    for n, saga in enumerate(sagas):
        started = SagaStarted(at=T0, saga_type="trip", input={})
        assert await store.create(NewSaga(saga, "trip", [started], Projection(SagaStatus.RUNNING)))
        ended = SagaCompleted(at=T0 + timedelta(seconds=n + 2), output={})
        done = Projection(SagaStatus.COMPLETED)
        assert await store.append(Append(saga, 1, [ended], done)) == 2
    window = (T0 - timedelta(hours=1), T0 + timedelta(hours=1))
    assert await store.insight_policies("trip", *window) == {1: 6}
    rows = {(f, k): c.runs for f, k, _, c in await store.insight_rows("trip", *window)}
    assert rows[("type", "completed")] == 6
    # The latest runs past the SLA, across both shards.
    breaches = await store.sla_breaches("trip", *window, timedelta(seconds=1), limit=3)
    assert breaches == sagas[::-1][:3]
    filtered = await store.count_by_status(SagaFilter(saga_type="trip"), cap=4)
    assert filtered == {SagaStatus.COMPLETED: 4}  # 3 + 3 past the cap: capped

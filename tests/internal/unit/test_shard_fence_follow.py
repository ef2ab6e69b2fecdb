"""A sharded store following the map (store/_sharded, issue 43): a shard refuses a write
for a partition it does not hold ('absent': reload the map, write to the new shard) or
holds as 'moving' (raise: the engine retries later); and the engine's reaction to the
refusal. In-memory shards with a fence of their own (the Postgres fence:
tests/internal/test_shard_fence.py)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, Signal
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._dead_letter_reason import dead_letter_reason
from saga_engine.kernel._errors import SagaNotFound, StaleShardMap
from saga_engine.kernel._partitioning import partition_for
from saga_engine.kernel._retry import is_transient
from saga_engine.kernel._shards import ShardMap
from saga_engine.runner._housekeeping import Housekeeping
from saga_engine.settings import EngineSettings, Settings
from saga_engine.store._memstore import InMemoryEventStore
from saga_engine.store._sharded import ShardedEventStore
from saga_engine.store._store import Append, EventStore, NewSaga, Projection
from saga_engine.testing import SagaTestEnv
from tests.internal.unit.test_sharded_store import new
from tests.waiting import eventually

MAP = ShardMap.build({"a": "0-3", "b": "4-7"}, 8)


class Fenced(InMemoryEventStore):
    """A shard's store with a fence: writes only the partitions it holds 'active'."""

    def __init__(self, name: str, held: dict[int, str]) -> None:
        super().__init__()
        self.name = name
        self.held = held
        self.refused: list[str] = []

    def _check(self, saga_id: str) -> None:
        partition = partition_for(saga_id, MAP.partitions)
        state = self.held.get(partition)
        if state != "active":
            self.refused.append(saga_id)
            raise StaleShardMap(saga_id, self.name, partition, moving=state == "moving")

    async def create(self, new: NewSaga) -> bool:
        self._check(new.saga_id)
        return await super().create(new)

    async def append(self, append: Append) -> int:
        self._check(append.saga_id)
        return await super().append(append)


class Cluster:
    """Two fenced shards, the control database's map, and what moving a range does."""

    def __init__(self) -> None:
        self.control = MAP
        self.loads = 0
        self.shards = {
            n: Fenced(n, dict.fromkeys(MAP.partitions_of(n), "active")) for n in MAP.names
        }

    async def load(self, known: int) -> ShardMap | None:
        self.loads += 1
        await asyncio.sleep(0)  # others asking meanwhile wait for this read
        return self.control if self.control.epoch > known else None

    def sharded(self, shard_map: ShardMap = MAP) -> ShardedEventStore:
        def opener(name: str):  # type: ignore[no-untyped-def]
            async def opened() -> EventStore:
                return self.shards[name]

            return opened

        return ShardedEventStore(shard_map, {n: opener(n) for n in MAP.names}, map_loader=self.load)

    def mark_moving(self, partition: int) -> None:
        self.shards[self.control.shard_of_partition(partition)].held[partition] = "moving"

    def finish_move(self, partition: int, to: str) -> None:
        """Copies the partition's sagas to ``to``, activates it there, advances the map
        and releases it on the source (a move's steps 3-6)."""
        source = self.shards[self.control.shard_of_partition(partition)]
        target = self.shards[to]
        for saga_id in [s for s in source._records if partition_for(s, 8) == partition]:
            target._records[saga_id] = source._records[saga_id]
            target._events[saga_id] = source._events[saga_id]
            if saga_id in source._runs:
                target._runs[saga_id] = source._runs[saga_id]
        target.held[partition] = "active"
        self.control = self.control.moved([partition], to)
        del source.held[partition]


def ids_in(partition: int, n: int, prefix: str = "s") -> list[str]:
    found = (f"{prefix}-{i}" for i in itertools.count())
    return list(itertools.islice((i for i in found if partition_for(i, 8) == partition), n))


def test_the_refusal_is_transient_and_says_how_to_react() -> None:
    absent = StaleShardMap("s-1", "a", 3, moving=False)
    moving = StaleShardMap("s-1", "a", 3, moving=True)
    assert is_transient(absent)
    assert is_transient(moving)
    assert dead_letter_reason(absent) is None  # the inbox retries it, never dead-letters
    assert "reload the shard map" in str(absent)
    assert "nothing was written" in str(absent)
    assert "being moved" in str(moving)
    assert "retry later" in str(moving)


async def test_a_write_under_an_old_map_reloads_it_and_goes_to_the_new_shard() -> None:
    cluster = Cluster()
    store = cluster.sharded()
    [saga_id] = ids_in(2, 1)  # partition 2: shard a
    assert await store.create(new(saga_id))
    cluster.finish_move(2, "b")
    assert store.shard_map.epoch == 1  # this store has not seen the move
    [other] = ids_in(2, 1, prefix="t")
    assert await store.create(new(other))  # refused by a, created on b
    assert cluster.shards["a"].refused == [other]
    assert other in cluster.shards["b"]._records
    assert other not in cluster.shards["a"]._records
    assert store.shard_map.epoch == 2
    assert store.shard_map.shard_of_saga(saga_id) == "b"
    assert cluster.loads == 1
    stale = cluster.sharded()  # another engine, still at epoch 1: its append goes to b
    assert await stale.append(Append(saga_id, 1, [], Projection(SagaStatus.RUNNING))) == 1
    assert cluster.shards["a"].refused == [other, saga_id]
    assert stale.shard_map.epoch == 2


async def test_a_moving_range_is_refused_without_a_retry_and_the_others_go_on() -> None:
    cluster = Cluster()
    store = cluster.sharded()
    [moving_id] = ids_in(2, 1)
    [other_id] = ids_in(1, 1)
    cluster.mark_moving(2)
    with pytest.raises(StaleShardMap) as caught:
        await store.create(new(moving_id))
    assert caught.value.moving
    assert caught.value.partition == 2
    assert caught.value.shard == "a"
    assert cluster.shards["a"].refused == [moving_id]  # once: the map did not change
    assert await store.create(new(other_id))
    assert moving_id not in cluster.shards["a"]._records


async def test_many_refused_at_once_read_the_map_once() -> None:
    cluster = Cluster()
    store = cluster.sharded()
    ids = ids_in(2, 6)
    cluster.finish_move(2, "b")
    assert all(await asyncio.gather(*(store.create(new(i)) for i in ids)))
    assert cluster.loads == 1
    assert set(ids) <= set(cluster.shards["b"]._records)


async def test_refresh_follows_the_map_for_reads_too() -> None:
    cluster = Cluster()
    store = cluster.sharded()
    [saga_id] = ids_in(2, 1)
    assert await store.create(new(saga_id))
    cluster.finish_move(2, "b")
    del cluster.shards["a"]._records[saga_id]  # the move's cleanup on the source
    assert await store.refresh_map()
    assert (await store.get(saga_id)).saga_id == saga_id  # read from b
    assert not await store.refresh_map()  # nothing newer


class Go(BaseModel):
    n: int = 1


class Parcel(BaseModel):
    ref: str = "p"


class Sent(BaseModel):
    n: int = 0


class Ship(Saga[Parcel, Sent]):
    name = "ship"
    go = Signal(Go)

    async def run(self, ctx: SagaContext, parcel: Parcel) -> Sent:
        got = await ctx.wait_signal(self.go)
        await ctx.step("hand-over", to="carrier", command=Parcel(ref=parcel.ref), returns=Sent)
        return Sent(n=got.n)


async def test_the_engine_sends_nothing_and_loads_the_saga_from_its_new_shard() -> None:
    """A refused input: nothing sent, the saga let go (not dead-lettered: retried by the
    inbox), and once the move is over the retry loads it from its new shard."""
    cluster = Cluster()
    env = SagaTestEnv([Ship], store=cluster.sharded())
    env.participant("carrier").on(Parcel, reply=Sent(n=7))
    run = await env.start(Ship, Parcel(), saga_id=ids_in(2, 1, prefix="ship")[0])
    assert await run.status() is SagaStatus.RUNNING
    cluster.mark_moving(2)
    with pytest.raises(StaleShardMap) as caught:
        await env.signal(run, "go", Go(n=3))
    assert dead_letter_reason(caught.value) is None
    assert env.commands("carrier") == []
    assert env.engine.runtime_of(run.saga_id) is None  # let go: loaded again next time
    cluster.finish_move(2, "b")
    await env.signal(run, "go", Go(n=3))  # the inbox's retry
    assert await run.status() is SagaStatus.COMPLETED
    assert len(env.commands("carrier")) == 1
    b, a = cluster.shards["b"], cluster.shards["a"]
    assert b._records[run.saga_id].status is SagaStatus.COMPLETED
    assert a._records[run.saga_id].status is SagaStatus.RUNNING  # the source's stale copy


async def test_a_map_the_store_cannot_follow_leaves_the_write_refused_and_retryable() -> None:
    cluster = Cluster()
    store = cluster.sharded()
    [saga_id] = ids_in(2, 1)
    cluster.finish_move(2, "b")
    # A move to a shard this engine's settings do not name.
    cluster.control = ShardMap(epoch=3, names=("a", "b", "c"), owners=cluster.control.owners)
    with pytest.raises(StaleShardMap) as caught:
        await store.create(new(saga_id))
    assert dead_letter_reason(caught.value) is None
    assert store.shard_map.epoch == 1


async def test_a_saga_not_found_on_its_old_shard_is_read_from_its_new_one() -> None:
    """A client's store, which nothing refreshes: after a move and its cleanup the saga
    is gone from the old shard, and the read follows the map to the new one."""
    cluster = Cluster()
    store = cluster.sharded()
    [saga_id] = ids_in(2, 1)
    assert await store.create(new(saga_id))
    cluster.finish_move(2, "b")
    del cluster.shards["a"]._records[saga_id]
    del cluster.shards["a"]._events[saga_id]
    assert (await store.get(saga_id)).saga_id == saga_id
    assert (await store.load(saga_id)).record.saga_id == saga_id
    assert store.shard_map.epoch == 2
    assert cluster.loads == 1
    with pytest.raises(SagaNotFound):  # one that exists nowhere is still not found
        await store.get("nowhere")


async def test_the_worker_reads_the_map_every_rollout_refresh() -> None:
    cluster = Cluster()
    store = cluster.sharded()
    settings = Settings(engine=EngineSettings(rollout_refresh_s=0.05))
    env = SagaTestEnv([Ship], store=store, settings=settings)
    chores = Housekeeping(env.engine, env.parts, lambda: (frozenset(), 8), lambda _: True)
    chores.start()
    try:
        cluster.finish_move(2, "b")
        await eventually(
            lambda: asyncio.sleep(0, store.shard_map.epoch == 2), what="the map followed"
        )
    finally:
        await chores.stop()
    assert store.shard_map.shard_of_partition(2) == "b"

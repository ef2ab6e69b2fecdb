"""A range moved while an engine drives its sagas (issue 43): a real worker over a
sharded store (shard ``a`` holding every partition, ``b`` none), sagas of the moving
range in flight (each waits between its two steps), the move run beside it. Every saga
completes, each step's command has one idempotency key (an effect once), every history
replays, and the range's sagas live in ``b`` only.

This needs the fence of the group commit (a write to a partition its shard holds as
``moving``, or not at all, is refused and the engine reloads the map): without it the
engine goes on writing the range's sagas to ``a`` after their rows were copied, and the
move's cleanup deletes what it wrote."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import timedelta

import pytest

from saga_engine import Saga, SagaContext, SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.core.planning._replay import HistoryExport, replay
from saga_engine.protocol import partition_for
from saga_engine.settings import AdminSettings, EngineSettings, KafkaSettings
from saga_engine.store._connect import connect_event_store
from saga_engine.store._pgshard_move import ShardMover
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.integration.kafka_helpers import fake_participant
from tests.integration.test_sharded_worker import Cmd, Done, Order
from tests.internal.test_shard_move import PARTITIONS, in_shard, settings_of
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class Paced(Saga[Order, Done]):
    name = "moved-paced"

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        await ctx.step("first", to="alpha", command=Cmd(n=input.n), compensate=Cmd(n=-input.n))
        await ctx.sleep(timedelta(seconds=1))
        await ctx.step("second", to="alpha", command=Cmd(n=input.n))
        return Done()


def _settings(pg: PgTarget, shards: tuple[PgTarget, ...], bootstrap: str, uid: str) -> Settings:
    kafka = KafkaSettings(
        bootstrap_servers=bootstrap,
        topic_prefix=f"t{uid}",
        group_id=f"engines-{uid}",
        partitions=PARTITIONS,
    )
    return settings_of(pg, shards).model_copy(
        update={"kafka": kafka, "engine": EngineSettings(), "admin": AdminSettings(port=0)}
    )


async def test_sagas_in_flight_on_a_moving_range_complete_once_each(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...], kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(pg, pg_shards, kafka_bootstrap, unique_id)
    worker = SagaWorker(settings, [Paced])
    await worker.start()
    try:
        async with fake_participant(settings, "alpha") as received, SagaClient(settings) as client:
            ids = [await client.start(Paced, Order(n=n)) for n in range(30)]

            await eventually(lambda: len(received) >= 5, what="five commands sent", timeout=60)
            lines: list[str] = []
            async with ShardMover.opened(settings.pg, batch=4, progress=lines.append) as mover:
                report = await mover.move("4-7", "b")
            results = await asyncio.gather(*(client.result(i, timeout=90) for i in ids))
    finally:
        await worker.stop()
    assert report.outcome == "moved"
    assert len(results) == len(ids)
    # Each effect once: one command (one idempotency key, command_id) per step of each
    # saga. A reply refused while its range was paused is retried, and the engine may
    # send its step's command again then, with the same key (the participant's dedup).
    keys = {(c.saga_id, c.step, c.command_id) for c in received}
    per_step = Counter((saga_id, step) for saga_id, step, _ in keys)
    assert {saga_id for saga_id, _ in per_step} == set(ids)
    assert sorted(Counter(saga_id for saga_id, _ in per_step).values()) == [2] * len(ids)
    assert all(n == 1 for n in per_step.values()), per_step

    moved = {i for i in ids if partition_for(i, PARTITIONS) >= 4}
    a, b = pg_shards
    assert await in_shard(b) == moved
    assert await in_shard(a) == set(ids) - moved
    store = await connect_event_store(settings)
    try:
        for saga_id in ids:
            loaded = await store.load(saga_id)
            assert loaded.record.status is SagaStatus.COMPLETED, saga_id
            history = HistoryExport(
                saga_id, loaded.record.saga_type, [s.event for s in loaded.events]
            )
            assert replay([Paced], history).deterministic, saga_id
    finally:
        await store.close()

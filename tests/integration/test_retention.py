"""Retention in the background, on the real Kafka and Postgres: the owning engine
archives its finished sagas past their period to ``saga_archive`` and deletes them;
open sagas stay; a per-type period keeps its type longer."""

from __future__ import annotations

import gzip

import pytest

from saga_engine import SagaNotFound, SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.replay import load_history
from saga_engine.settings import RetentionSettings
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.integration.test_failover import Order, Parked, make_settings, owned, running, status
from tests.waiting import eventually

pytestmark = pytest.mark.integration

SECOND = 1 / 86_400  # in days


async def test_the_owner_archives_finished_sagas_past_their_period(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    base = make_settings(pg, kafka_bootstrap, unique_id)
    settings = base.model_copy(
        update={"retention": RetentionSettings(days=0.5 * SECOND, interval_s=0.2)}
    )
    worker = SagaWorker(settings, [Parked])
    async with running(worker), SagaClient(settings) as client:
        await worker.start()
        await eventually(owned(worker))
        assert worker.engine is not None
        store = worker.parts.store
        finished = [await client.start(Parked, Order(nap_s=0.1)) for _ in range(5)]
        waiting = [await client.start(Parked, Order()) for _ in range(2)]

        async def archived() -> bool:
            for saga_id in finished:
                if await store.archived_history(saga_id) is None:
                    return False
                try:
                    await store.get(saga_id)
                    return False  # archived and still there: not deleted
                except SagaNotFound:
                    pass
            return True

        await eventually(archived, timeout=30)
        for saga_id in finished:
            blob = await store.archived_history(saga_id)
            assert blob is not None
            history = load_history(gzip.decompress(blob))
            assert history.saga_id == saga_id
            assert history.events[-1].kind == "saga_completed"
        for saga_id in waiting:
            assert await status(worker, saga_id) is SagaStatus.RUNNING
        assert worker.parts.stats.counts["sagas_archived"] >= len(finished)


async def test_a_per_type_period_keeps_that_type(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    base = make_settings(pg, kafka_bootstrap, unique_id)
    settings: Settings = base.model_copy(
        update={
            "retention": RetentionSettings(
                days=0.5 * SECOND, per_type={"parked": 30.0}, interval_s=0.2
            )
        }
    )
    worker = SagaWorker(settings, [Parked])
    async with running(worker), SagaClient(settings) as client:
        await worker.start()
        await eventually(owned(worker))
        assert worker.engine is not None
        saga_id = await client.start(Parked, Order(nap_s=0.1))

        async def completed() -> bool:
            return await status(worker, saga_id) is SagaStatus.COMPLETED

        await eventually(completed, timeout=30)
        # Several passes later (each 0.2 s) it is still there: its type keeps 30 days.
        first = _passes(worker)
        await eventually(lambda: _passes(worker) >= first + 5)
        assert await status(worker, saga_id) is SagaStatus.COMPLETED
        assert await worker.parts.store.archived_history(saga_id) is None


def _passes(worker: SagaWorker) -> int:
    assert worker._housekeeping is not None
    return worker._housekeeping.retention_passes

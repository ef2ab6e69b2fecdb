"""Bounded memory on the real Kafka and Postgres: sagas that only wait are evicted, the
cache holds at most ``engine.cache_size``, timers of evicted sagas fire from Postgres,
signals reach evicted sagas, and no per-saga lock or watcher outlives its use."""

from __future__ import annotations

import pytest

from saga_engine import SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.events import TimerFired, TimerStarted
from saga_engine.settings import EngineSettings
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.integration.test_failover import Go, Order, Parked, make_settings, owned, running, status
from tests.waiting import eventually

pytestmark = pytest.mark.integration

CACHE = 8


@pytest.fixture
def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> Settings:
    base = make_settings(pg, kafka_bootstrap, unique_id)
    return base.model_copy(
        update={"engine": EngineSettings(cache_size=CACHE, idle_evict_s=0.3, timer_poll_s=0.1)}
    )


async def test_waiting_sagas_leave_memory_and_still_wake_and_take_signals(
    settings: Settings,
) -> None:
    worker = SagaWorker(settings, [Parked])
    async with running(worker), SagaClient(settings) as client:
        await worker.start()
        await eventually(owned(worker))
        assert worker.engine is not None
        engine, parts = worker.engine, worker.parts
        waiting = [await client.start(Parked, Order()) for _ in range(20)]
        napping = [await client.start(Parked, Order(nap_s=3)) for _ in range(10)]

        async def recorded() -> bool:
            return all([await status(worker, i) is SagaStatus.RUNNING for i in waiting + napping])

        await eventually(recorded, timeout=30)
        # Idle past idle_evict_s: evicted, down to none at all (none has a command out).
        await eventually(lambda: not engine.live_saga_ids(), timeout=30)
        assert parts.stats.counts["sagas_evicted"] >= 30

        # The naps end while their sagas are out of memory: the store says they are due,
        # the poller wakes them, and they complete.
        async def all_done(ids: list[str]) -> bool:
            return all([await status(worker, i) is SagaStatus.COMPLETED for i in ids])

        await eventually(lambda: all_done(napping), timeout=30)
        assert parts.stats.counts["sagas_woken"] >= len(napping)

        # A signal to an evicted saga reloads it from history and it goes on.
        for saga_id in waiting:
            await client.signal(saga_id, "go", Go())
        await eventually(lambda: all_done(waiting), timeout=30)

        # Nothing per saga is left behind.
        await eventually(lambda: not engine.live_saga_ids(), timeout=30)
        assert len(parts.live.locks) == 0
        assert not parts.waiters


async def test_the_cache_bound_holds_while_sagas_are_busy(settings: Settings) -> None:
    # Never idle long enough to be evicted as idle: only the size bound evicts.
    busy = settings.model_copy(
        update={"engine": EngineSettings(cache_size=CACHE, idle_evict_s=3600, timer_poll_s=0.1)}
    )
    worker = SagaWorker(busy, [Parked])
    async with running(worker), SagaClient(busy) as client:
        await worker.start()
        await eventually(owned(worker))
        assert worker.engine is not None
        engine = worker.engine
        ids = [await client.start(Parked, Order()) for _ in range(3 * CACHE)]

        async def recorded() -> bool:
            return all([await status(worker, i) is SagaStatus.RUNNING for i in ids])

        await eventually(recorded, timeout=30)
        await eventually(lambda: len(engine.live_saga_ids()) <= CACHE, timeout=30)
        for saga_id in ids:
            await client.signal(saga_id, "go", Go())

        async def done() -> bool:
            return all([await status(worker, i) is SagaStatus.COMPLETED for i in ids])

        await eventually(done, timeout=30)


async def test_wake_ups_due_soon_are_loaded_ahead_and_fire_on_time(settings: Settings) -> None:
    ahead = settings.model_copy(
        update={
            "engine": EngineSettings(
                cache_size=CACHE, idle_evict_s=0.3, timer_poll_s=0.1, timer_lookahead_s=2.0
            )
        }
    )
    worker = SagaWorker(ahead, [Parked])
    async with running(worker), SagaClient(ahead) as client:
        await worker.start()
        await eventually(owned(worker))
        assert worker.engine is not None
        engine, parts = worker.engine, worker.parts
        napping = [await client.start(Parked, Order(nap_s=4)) for _ in range(6)]

        async def all_done() -> bool:
            return all([await status(worker, i) is SagaStatus.COMPLETED for i in napping])

        await eventually(all_done, timeout=30)
        # Evicted while idle, then loaded again ahead of their wake-up by the poller.
        assert parts.stats.counts["sagas_evicted"] >= len(napping)
        assert parts.stats.counts["sagas_woken"] >= len(napping)
        for saga_id in napping:
            history = await engine.history(saga_id)
            [started] = [e for e in history if isinstance(e, TimerStarted)]
            [fired] = [e for e in history if isinstance(e, TimerFired)]
            # Fired from memory at its time, not a poll late.
            assert (fired.at - started.fire_at).total_seconds() < 1.0

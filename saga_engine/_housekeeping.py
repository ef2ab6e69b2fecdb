"""What an engine worker does in the background besides consuming its inbox.

- **Every ``engine.timer_poll_s``**: evict idle sagas (``engine.idle_evict_s``,
  ``engine.cache_size``), then load the sagas of the owned partitions whose wake-up the
  store says is due within ``engine.timer_lookahead_s`` and which are not in memory with
  a timer armed. Loaded, a saga arms its timer, which fires from memory at its time (one
  already due fires at once). That is how a timer of an evicted saga fires on time.
- **Every ``retention.interval_s``** (when a retention period is set): archive and delete
  up to ten batches of the owned partitions' finished sagas past their period. A backlog
  (retention just turned on) drains over the following passes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import timedelta

from saga_engine._engine import Engine
from saga_engine._errors import SagaError, TransientError
from saga_engine._retention import Retention
from saga_engine._store import EventStore
from saga_engine._telemetry import detach_from_trace
from saga_engine.settings import Settings

log = logging.getLogger("saga_engine.worker")

#: Batches of ``retention.batch_size`` per background pass.
_RETENTION_BATCHES = 10
#: Sagas woken per poll at most (soonest first), and how many load at once.
_WAKE_BATCH = 2000
_WAKE_CONCURRENCY = 64


class Housekeeping:
    def __init__(
        self,
        engine: Engine,
        store: EventStore,
        settings: Settings,
        partitions: Callable[[], tuple[frozenset[int], int]],
        owns: Callable[[str], bool],
    ) -> None:
        self._engine = engine
        self._store = store
        self._settings = settings
        self._partitions = partitions
        self._owns = owns
        self._tasks: list[asyncio.Task[None]] = []
        #: Retention passes run so far (observable by tests and operators).
        self.retention_passes = 0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._timers(), name="saga-timers"))
        retention = self._settings.retention
        if retention.days is not None or retention.per_type:
            self._tasks.append(loop.create_task(self._retention(), name="saga-retention"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        self._tasks.clear()

    async def _timers(self) -> None:
        engine, config = self._engine, self._settings.engine
        detach_from_trace()
        while True:
            await asyncio.sleep(config.timer_poll_s)  # a period, not a synchronisation
            horizon = engine.clock.now() + timedelta(seconds=config.timer_lookahead_s)
            engine.evict_idle(config.idle_evict_s, config.cache_size, keep_due_before=horizon)
            mine, count = self._partitions()
            if not mine:
                continue
            try:
                due = await self._store.due_wakeups(horizon, mine, count, limit=_WAKE_BATCH)
            except TransientError as exc:
                log.warning("polling due wake-ups failed (%s); trying again", exc)
                continue
            waking = [i for i in due if not engine.live.holds_timer(i) and self._owns(i)]
            if waking:
                await self._wake(waking)

    async def _wake(self, saga_ids: list[str]) -> None:
        limit = asyncio.Semaphore(_WAKE_CONCURRENCY)

        async def one(saga_id: str) -> None:
            async with limit:
                try:
                    await self._engine.wake(saga_id)
                except SagaError as exc:  # the next poll tries again
                    log.warning("waking saga %s failed: %s", saga_id, exc)

        await asyncio.gather(*(one(i) for i in saga_ids))

    async def _retention(self) -> None:
        retention = Retention(self._settings.retention, self._store)
        detach_from_trace()
        while True:
            await asyncio.sleep(self._settings.retention.interval_s)  # a period
            mine, count = self._partitions()
            if not mine:
                continue
            try:
                report = await retention.run(
                    self._engine.clock.now(),
                    partitions=mine,
                    partition_count=count,
                    max_batches=_RETENTION_BATCHES,
                )
            except (TransientError, OSError) as exc:
                log.warning("retention pass failed (%s); trying again next time", exc)
                continue
            self.retention_passes += 1
            if report.deleted:
                self._engine.stats.inc("sagas_archived", report.deleted)

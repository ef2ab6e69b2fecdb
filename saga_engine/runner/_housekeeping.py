"""What an engine worker does in the background besides consuming its inbox.

- **Every ``engine.timer_poll_s``**: evict idle sagas (``engine.idle_evict_s``,
  ``engine.cache_size``), then load the sagas of the owned partitions whose wake-up the
  store says is due within ``engine.timer_lookahead_s`` and which are not in memory with
  a timer armed. Loaded, a saga arms its timer, which fires from memory at its time (one
  already due fires at once). That is how a timer of an evicted saga fires on time.
- **Every ``engine.key_sweep_s``** (when a saga type declares ``concurrency``): release
  the key slots of sagas that ended without releasing them, and wake who gets them.
- **Every ``engine.insights_rollup_s``**: add the runs that ended since to the insights'
  aggregates (``InsightStore.roll_up_insights``), a batch at a time until none is left;
  engines doing it at once take disjoint runs.
- **Every ``retention.interval_s``** (when a retention period is set): archive and delete
  up to ten batches of the owned partitions' finished sagas past their period. A backlog
  (retention just turned on) drains over the following passes.
- **Every ``engine.rollout_refresh_s``** (past one database): read the shard map's epoch
  from the control database and route by the newer map when a move advanced it
  (``ShardedEventStore.refresh_map``), so that reads follow a moved range too.
- **Every ``codec.blobs.sweep_interval_s``** (when payloads go by reference): delete the
  blobs no saga references any more, past ``codec.blobs.grace_s`` (the store's
  ``sweep_blobs``; docs/large-payloads.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from saga_engine.core.history._codec import CodecChain
from saga_engine.kernel._errors import (
    NewerVersionError,
    SagaError,
    ShardMapError,
    TransientError,
)
from saga_engine.runner._engine import Engine
from saga_engine.runner._learned_costs import keep_learned_costs_fresh
from saga_engine.runner._parts import EngineParts
from saga_engine.runner._retention import Retention
from saga_engine.runner._rollouts import keep_rollouts_fresh, needs_rollouts
from saga_engine.store._insight_store import InsightStore
from saga_engine.store._store import FollowsShardMap
from saga_engine.telemetry._telemetry import detach_from_trace

log = logging.getLogger("saga_engine.worker")

#: Batches of ``retention.batch_size`` per background pass.
_RETENTION_BATCHES = 10
#: Runs per insights roll-up transaction, and roll-ups per period at most.
_ROLLUP_BATCH = 2000
_ROLLUP_BATCHES = 50
#: Sagas woken per poll at most (soonest first), and how many load at once.
_WAKE_BATCH = 2000
#: Pages of due wake-ups read per poll at most, past the sagas already loaded ahead.
_WAKE_PAGES = 10
_WAKE_CONCURRENCY = 64


class Housekeeping:
    def __init__(
        self,
        engine: Engine,
        parts: EngineParts,
        partitions: Callable[[], tuple[frozenset[int], int]],
        owns: Callable[[str], bool],
        codec: CodecChain | None = None,
    ) -> None:
        """Works on ``engine``'s sagas, with the collaborators it was built from."""
        self._engine = engine
        self._parts = parts
        self._codec = codec
        self._store = parts.store
        self._settings = parts.settings
        self._clock = parts.clock
        self._live = parts.live
        self._partitions = partitions
        self._owns = owns
        self._tasks: list[asyncio.Task[None]] = []
        #: Retention passes run so far (observable by tests and operators).
        self.retention_passes = 0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._timers(), name="saga-timers"))
        if needs_rollouts(self._parts.registry, self._parts.settings.limits):
            every = self._settings.engine.rollout_refresh_s
            rollouts = keep_rollouts_fresh(self._parts, every)
            self._tasks.append(loop.create_task(rollouts, name="saga-rollouts"))
        if isinstance(self._store, FollowsShardMap):
            follow = self._follow_map(self._store)
            self._tasks.append(loop.create_task(follow, name="saga-shard-map"))
        if any(d.concurrency is not None for d in self._parts.registry):
            self._tasks.append(loop.create_task(self._key_sweep(), name="saga-key-sweep"))
        if isinstance(self._store, InsightStore):
            insights = self._roll_up_insights(self._store)
            self._tasks.append(loop.create_task(insights, name="saga-insights-rollup"))
            learned = keep_learned_costs_fresh(
                self._parts.learned, self._store, self._parts.registry.names(), self._clock.now
            )
            self._tasks.append(loop.create_task(learned, name="saga-learned-costs"))
        retention = self._settings.retention
        if retention.days is not None or retention.per_type:
            self._tasks.append(loop.create_task(self._retention(), name="saga-retention"))
        sweeper = getattr(self._store, "sweep_blobs", None)
        if self._settings.codec.blobs.enabled and sweeper is not None:
            self._tasks.append(loop.create_task(self._sweep_blobs(sweeper), name="saga-blob-sweep"))

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
            horizon = self._clock.now() + timedelta(seconds=config.timer_lookahead_s)
            try:
                engine.evict_idle(config.idle_evict_s, config.cache_size, keep_due_before=horizon)
            except Exception:
                log.exception("evicting idle sagas failed")
            mine, count = self._partitions()
            if not mine:
                continue
            try:
                waking = await self._due(horizon, mine, count)
                if waking:
                    await self._load_due(waking)
            except TransientError as exc:
                log.warning("polling due wake-ups failed (%s); trying again", exc)
            except Exception:
                # A bug must not end the poller: every evicted saga's timers hang on it.
                log.exception("polling due wake-ups failed; trying again")

    async def _sweep_blobs(self, sweep: Callable[[timedelta], Awaitable[int]]) -> None:
        blobs = self._settings.codec.blobs
        detach_from_trace()
        while True:
            await asyncio.sleep(blobs.sweep_interval_s)  # a period, not a synchronisation
            try:
                deleted = await sweep(timedelta(seconds=blobs.grace_s))
            except TransientError as exc:
                log.warning("sweeping unreferenced blobs failed (%s); trying again", exc)
                continue
            except Exception:
                log.exception("sweeping unreferenced blobs failed; trying again")
                continue
            if deleted:
                log.info("deleted %d unreferenced blob(s)", deleted)

    async def _due(self, horizon: datetime, mine: frozenset[int], count: int) -> list[str]:
        """Up to _WAKE_BATCH sagas due before ``horizon`` and not in memory with a timer,
        soonest first. Those already loaded ahead are paged past (a burst larger than a
        batch would otherwise return the same loaded sagas on every poll)."""
        waking: list[str] = []
        after: tuple[datetime, str] | None = None
        for _ in range(_WAKE_PAGES):
            page = await self._store.due_wakeups(
                horizon, mine, count, limit=_WAKE_BATCH, after=after
            )
            waking += [i for i, _ in page if not self._live.holds_timer(i) and self._owns(i)]
            if len(page) < _WAKE_BATCH or len(waking) >= _WAKE_BATCH:
                break
            after = (page[-1][1], page[-1][0])
        return waking[:_WAKE_BATCH]

    async def _load_due(self, saga_ids: list[str]) -> None:
        limit = asyncio.Semaphore(_WAKE_CONCURRENCY)

        async def one(saga_id: str) -> None:
            async with limit:
                try:
                    await self._engine.load_due(saga_id)
                except NewerVersionError as exc:  # said once by recovery, not every poll
                    log.debug("saga %s waits for a newer engine: %s", saga_id, exc)
                except SagaError as exc:  # the next poll tries again
                    log.warning("waking saga %s failed: %s", saga_id, exc)
                except Exception:
                    log.exception("waking saga %s failed", saga_id)

        await asyncio.gather(*(one(i) for i in saga_ids))

    async def _follow_map(self, store: FollowsShardMap) -> None:
        detach_from_trace()
        while True:
            await asyncio.sleep(self._settings.engine.rollout_refresh_s)  # a period
            try:
                if await store.refresh_map():
                    log.info("the shard map changed: routing by the new one")
            except Exception as exc:  # an outage, a map to fix or a bug: tried again
                bug = not isinstance(exc, TransientError | OSError | ShardMapError)
                log.warning("reading the shard map failed: %s", exc, exc_info=bug)

    async def _key_sweep(self) -> None:
        """Releases the key slots of sagas that ended without releasing them (their
        engine was killed in between); the release is owed from their history."""
        detach_from_trace()
        while True:
            await asyncio.sleep(self._settings.engine.key_sweep_s)  # a period
            try:
                granted = await self._engine.sweep_keys()
            except Exception as exc:  # an outage or a bug: the next period tries again
                bug = not isinstance(exc, TransientError | OSError)
                log.warning("sweeping concurrency keys failed: %s", exc, exc_info=bug)
            else:
                if granted:
                    self._parts.stats.inc("key_swept", granted)

    async def _roll_up_insights(self, store: InsightStore) -> None:
        detach_from_trace()
        while True:
            await asyncio.sleep(self._settings.engine.insights_rollup_s)  # a period
            try:
                for _ in range(_ROLLUP_BATCHES):
                    if await store.roll_up_insights(_ROLLUP_BATCH) < _ROLLUP_BATCH:
                        break
            except Exception as exc:  # an outage or a bug: the next period tries again
                bug = not isinstance(exc, TransientError | OSError)
                log.warning("rolling up insights failed: %s", exc, exc_info=bug)

    async def _retention(self) -> None:
        retention = Retention(self._settings.retention, self._store, self._codec)
        detach_from_trace()
        while True:
            await asyncio.sleep(self._settings.retention.interval_s)  # a period
            mine, count = self._partitions()
            if not mine:
                continue
            try:
                report = await retention.run(
                    self._clock.now(),
                    partitions=mine,
                    partition_count=count,
                    max_batches=_RETENTION_BATCHES,
                )
            except (TransientError, OSError) as exc:
                log.warning("retention pass failed (%s); trying again next time", exc)
                continue
            except Exception:
                log.exception("retention pass failed; trying again next time")
                continue
            self.retention_passes += 1
            if report.deleted:
                self._parts.stats.inc("sagas_archived", report.deleted)

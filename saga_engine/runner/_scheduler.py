"""The scheduler loop a worker runs: due schedules claimed from the schedule store, their
ticks' start requests sent (``fire``, the worker's ``KafkaStarts``: to the saga inbox),
then the schedules moved on.

Every worker runs one; they share the due schedules through the claim's row locks
(``_pgschedules``), so any number of engines fire each tick once. The loop sleeps until
the earliest next tick (at most ``schedules.poll_s``), then claims batches of
``schedules.batch_size`` until none is due. With no schedule, each round is one
indexed query.

The start requests go through the inbox like a ``SagaClient`` start, so the engine that
owns the saga's partition starts it, and a start sent twice (the claim's transaction
died after Kafka acknowledged it) is deduplicated there by its saga id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from saga_engine.core.planning._schedule import Schedule
from saga_engine.kernel._settings import ScheduleSettings
from saga_engine.runner._polling import PollingLoop
from saga_engine.store._schedule_store import Fire, FireResult, ScheduleStore

__all__ = ["CRASH_POINT", "Scheduler", "load_schedules", "utc_now"]

log = logging.getLogger("saga_engine.schedules")

#: The crash point between "the ticks' starts are acknowledged by Kafka" and "the claim
#: that moves next_fire_at commits" (``SAGA_CRASH_AT=schedule_after_fire``).
CRASH_POINT = "schedule_after_fire"


def utc_now() -> datetime:
    return datetime.now(UTC)


class Scheduler:
    """Fires due schedules until stopped. ``clock`` is injectable for tests;
    ``on_fired(result, durable_at)`` is told each claim that fired something."""

    def __init__(
        self,
        store: ScheduleStore,
        fire: Fire,
        settings: ScheduleSettings,
        *,
        clock: Callable[[], datetime] = utc_now,
        crash_hook: Callable[[str], None] | None = None,
        on_fired: Callable[[FireResult, datetime], None] | None = None,
    ) -> None:
        self._store = store
        self._fire = fire
        self._settings = settings
        self._clock = clock
        self._crash_hook = crash_hook
        self._on_fired = on_fired
        self._loop = PollingLoop(
            "saga-schedules",
            self._round,
            poll_s=settings.poll_s,
            what="firing schedules",
            log=log,
        )
        self.fired = 0
        self.skipped = 0

    def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        # Cancelled mid-claim, the transaction rolls back: the claimed ticks stay due for
        # the next engine (their starts, if sent, are deduplicated).
        await self._loop.stop()

    async def run_due(self) -> int:
        """Claims and fires until no schedule is due now; the number of ticks fired.

        A full first batch means a burst: ``claims_in_flight`` claims then run at once
        (SKIP LOCKED gives them disjoint rows), so that one's encoding overlaps another's
        wait for Postgres and Kafka."""
        fired, full = await self._claim()
        if full:
            more = await asyncio.gather(
                *(self._drain() for _ in range(self._settings.claims_in_flight))
            )
            fired += sum(more)
        return fired

    async def _drain(self) -> int:
        fired, full = 0, True
        while full:
            n, full = await self._claim()
            fired += n
        return fired

    async def _claim(self) -> tuple[int, bool]:
        result = await self._store.fire_due(
            self._clock(),
            self._settings.batch_size,
            self._fire,
            clock=self._clock,
            after_fire=self._after_fire,
        )
        self.fired += len(result.fired)
        self.skipped += result.skipped
        if self._on_fired is not None and result.claimed:
            self._on_fired(result, self._clock())
        return len(result.fired), result.claimed >= self._settings.batch_size

    def _after_fire(self) -> None:
        if self._crash_hook is not None:
            self._crash_hook(CRASH_POINT)

    async def _round(self) -> float:
        """Fires what is due; how long until the earliest next tick (at most poll_s)."""
        await self.run_due()
        earliest = await self._store.earliest_due()
        delay = self._settings.poll_s
        if earliest is not None:
            delay = min(delay, max(0.0, (earliest - self._clock()).total_seconds()))
        return max(delay, self._settings.coalesce_s)


def load_schedules(spec: str) -> list[Schedule]:
    """Every ``Schedule`` defined at the top level of the module named by ``spec`` (what
    ``saga worker APP`` declares, as it finds the module's triggers)."""
    import importlib

    module = importlib.import_module(spec.partition(":")[0])
    return [v for v in vars(module).values() if isinstance(v, Schedule)]

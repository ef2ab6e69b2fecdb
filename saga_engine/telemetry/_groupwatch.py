"""Watches one consumer-group member's generations, so a group that will not settle is seen.

A group that keeps rebalancing consumes nothing: each member's partitions are revoked
before every generation, and a generation whose SyncGroup fails is never assigned at
all, so the rebalance listener is not even called (issue 22 saw 4,612 generations in 8
minutes, and nothing but aiokafka's INFO lines said so). The watch samples the member's
generation once a second, from aiokafka's group coordinator: it has no public accessor,
and it is the only thing that moves during such a storm. Generation numbers are the
group's own, so a sample that finds the number up by n counts n rebalances, whatever
was missed between two samples.

It feeds the ``saga.kafka.rebalances`` counter and the per-minute gauge, and, past
``warn_after`` rebalances in a minute, logs a WARNING naming the group and the member
(once a minute while it lasts) and reports the group on the health board.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from saga_engine.telemetry._health import HealthBoard

if TYPE_CHECKING:
    from saga_engine.telemetry._telemetry import Telemetry

log = logging.getLogger("saga_engine.kafka")

#: A start of a few instances takes 1-3 generations, a rolling restart with static
#: membership none: more than this many in a minute is a group that does not settle.
WARN_AFTER: Final = 5


class GroupWatch:
    """Counts the generations ``consumer`` joins in group ``group`` as ``member``."""

    def __init__(
        self,
        consumer: Any,
        *,
        group: str,
        member: str,
        on_rebalances: Callable[[str, int], None] | None = None,
        health: HealthBoard | None = None,
        interval_s: float = 1.0,
        window_s: float = 60.0,
        warn_after: int = WARN_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._consumer = consumer
        self.group = group
        self.member = member
        self._on_rebalances = on_rebalances
        self._health = health
        self._interval_s = interval_s
        self._window_s = window_s
        self._warn_after = warn_after
        self._clock = clock
        self.generation = -1
        self._seen: collections.deque[float] = collections.deque()
        self._warned_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        #: Every rebalance seen since the start (the first join included).
        self.total = 0

    def start(self) -> None:
        """Samples in the background from now: before ``consumer.start()``, whose wait
        for a first assignment is where a storm at start-up shows."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"group-watch-{self.group}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._health is not None:
            self._health.clear(self._key)

    async def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # a watch must never take its consumer down
                log.exception("watching group %s failed", self.group)
            await asyncio.sleep(self._interval_s)

    @property
    def _key(self) -> str:
        return f"group:{self.group}:{self.member}"

    def per_minute(self) -> int:
        """Rebalances seen in the last window (a minute by default)."""
        self._forget(self._clock())
        return len(self._seen)

    def sample(self) -> None:
        coordinator = getattr(self._consumer, "_coordinator", None)
        generation = getattr(coordinator, "generation", -1)
        now = self._clock()
        # -1: no generation (not joined yet, or reset after an error, before a rejoin).
        if isinstance(generation, int) and generation > self.generation >= -1:
            new = 1 if self.generation < 0 else generation - self.generation
            self.generation = generation
            self._seen.extend([now] * new)
            self.total += new
            if self._on_rebalances is not None:
                self._on_rebalances(self.group, new)
        self._forget(now)
        self._judge(now, generation, getattr(coordinator, "member_id", ""))

    def _forget(self, now: float) -> None:
        while self._seen and self._seen[0] <= now - self._window_s:
            self._seen.popleft()

    def _judge(self, now: float, generation: object, member_id: object) -> None:
        count = len(self._seen)
        if count <= self._warn_after:
            self._warned_at = None
            if self._health is not None:
                self._health.clear(self._key)
            return
        if self._warned_at is None or now - self._warned_at >= self._window_s:
            self._warned_at = now
            log.warning(
                "consumer group %s does not settle: member %s (%s) rejoined %d times in the "
                "last %.0fs (now generation %s); it consumes nothing while this lasts. "
                "See 'Instances and consumer groups' in docs/operations.md",
                self.group,
                self.member,
                member_id or "no member id",
                count,
                self._window_s,
                generation,
            )
        if self._health is not None:
            self._health.report(
                self._key,
                f"consumer group {self.group} is rebalancing: member {self.member} "
                f"rejoined {count} times in the last {self._window_s:.0f}s",
            )


def watch_member(
    consumer: Any, *, group: str, member: str, telemetry: Telemetry, health: HealthBoard
) -> GroupWatch:
    """A started watch of ``consumer``, counted in ``telemetry``'s rebalance metrics."""
    watch = GroupWatch(
        consumer,
        group=group,
        member=member,
        on_rebalances=telemetry.count_rebalances,
        health=health,
    )
    telemetry.watch_group(watch)
    watch.start()
    return watch

"""The overlap crash test's engine app (``saga worker tests.internal.e2e.schedule_overlap_app``):
a schedule ticking every second, ``catchup=last`` and ``overlap=skip``, whose saga runs
for a few seconds, so that every tick after the first meets a running saga."""

from __future__ import annotations

from datetime import timedelta

from saga_engine import Saga, SagaContext
from saga_engine.schedules import CatchUp, Overlap, Schedule
from tests.internal.e2e.schedule_app import Tick, Tock

#: How long each tick's saga runs: longer than the engine takes to come back after a
#: crash, so the crashed tick's saga still runs when the newer ticks are due.
RUNS_S = 3


class Slow(Saga[Tick, Tock]):
    name = "slow-report"

    async def run(self, ctx: SagaContext, tick: Tick) -> Tock:
        await ctx.sleep(timedelta(seconds=RUNS_S))
        return Tock()


ONE_AT_A_TIME = Schedule(
    id="one-at-a-time",
    saga=Slow,
    every_s=1,
    catchup=CatchUp.LAST,
    overlap=Overlap.SKIP,
)

"""Two engines racing for the same schedules: ``saga worker
tests.internal.e2e.schedule_race_app`` in two processes. Forty schedules tick every
second, with their phases spread over it, so both engines' claims meet on every tick."""

from __future__ import annotations

from saga_engine import Saga, SagaContext
from saga_engine.schedules import CatchUp, Overlap, Schedule
from tests.internal.e2e.schedule_app import Tick, Tock


class Pulse(Saga[Tick, Tock]):
    name = "pulse"

    async def run(self, ctx: SagaContext, tick: Tick) -> Tock:
        return Tock()


COUNT = 40

for _i in range(COUNT):
    # Module-level names: `saga worker` declares every Schedule defined at the top level.
    globals()[f"RACE_{_i:02d}"] = Schedule(
        id=f"race-{_i:02d}",
        saga=Pulse,
        every_s=1,
        offset_s=round(_i / COUNT, 3),
        catchup=CatchUp.ALL,
        catchup_max=1000,
        overlap=Overlap.ALLOW,
    )

__all__ = ["COUNT", "Pulse"]

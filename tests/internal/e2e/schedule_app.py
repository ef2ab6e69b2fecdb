"""The crash test's engine app for schedules: one saga type and a schedule declared in
code that ticks every second (``saga worker tests.internal.e2e.schedule_app``)."""

from __future__ import annotations

from pydantic import BaseModel

from saga_engine import Saga, SagaContext
from saga_engine.schedules import CatchUp, Overlap, Schedule


class Tick(BaseModel):
    source: str = "schedule"


class Tock(BaseModel):
    ok: bool = True


class Heartbeat(Saga[Tick, Tock]):
    name = "heartbeat"

    async def run(self, ctx: SagaContext, tick: Tick) -> Tock:
        return Tock()


#: Every missed tick is caught up after a restart, so a crash may neither lose a tick
#: (it would be missing from the sagas) nor double one (two sagas for one key).
EVERY_SECOND = Schedule(
    id="heartbeat",
    saga=Heartbeat,
    every_s=1,
    catchup=CatchUp.ALL,
    catchup_max=1000,
    overlap=Overlap.ALLOW,
)

"""A race for ``saga drill`` (issue 41): each order's capture races a half-second durable
timer. The payments participant takes 0 to 1 s to capture (by the order's number), so
about half the captures lose: given up while in flight, applied late, and refunded once.

    saga drill --sagas tests.internal.e2e.drill_race_app \\
        --participants tests.internal.e2e.drill_race_app --scenario engine-kill ...
    python -m tests.internal.e2e.drill_race_app participant NAME
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from datetime import timedelta

from pydantic import BaseModel

from saga_engine import Saga, SagaContext, Settings, run
from saga_engine.participant import Participant, Transaction
from tests.internal.e2e.participant_main import serve_participant

PARTICIPANTS = ("payments", "mail")
#: How long a capture has before the timer wins.
WINDOW = timedelta(seconds=0.5)


class RaceInput(BaseModel):
    order: int


class RaceDone(BaseModel):
    outcome: str


class Capture(BaseModel):
    order: int


class Refund(BaseModel):
    order: int


class Notify(BaseModel):
    order: int
    outcome: str


class Done(BaseModel):
    by: str


class DrillRace(Saga[RaceInput, RaceDone]):
    name = "drill-race"

    async def run(self, ctx: SagaContext, req: RaceInput) -> RaceDone:
        won = await ctx.first(
            captured=ctx.step(
                "capture",
                to="payments",
                command=Capture(order=req.order),
                compensate=Refund(order=req.order),
                timeout=30,
                returns=Done,
            ),
            expired=ctx.sleep(WINDOW),
        )
        await ctx.step(
            "notify", to="mail", command=Notify(order=req.order, outcome=won.name), timeout=30
        )
        return RaceDone(outcome=won.name)


def drill_participants() -> dict[str, list[str]]:
    return {
        name: ["-m", "tests.internal.e2e.drill_race_app", "participant", name]
        for name in PARTICIPANTS
    }


def drill_inputs() -> Iterator[RaceInput]:
    n = 0
    while True:
        yield RaceInput(order=n)
        n += 1


def build_participant(name: str, settings: Settings) -> Participant:
    participant = Participant(name, settings)

    @participant.handles(Capture)
    async def capture(cmd: Capture, tx: Transaction) -> Done:
        await asyncio.sleep((cmd.order % 5) * 0.25)  # a slow acquirer, now and then
        return Done(by=name)

    @participant.handles(Refund)
    async def refund(cmd: Refund, tx: Transaction) -> Done:
        return Done(by=name)

    @participant.handles(Notify)
    async def notify(cmd: Notify, tx: Transaction) -> Done:
        return Done(by=name)

    return participant


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "participant":
        sys.exit("usage: python -m tests.internal.e2e.drill_race_app participant NAME")
    run(serve_participant(lambda settings: build_participant(sys.argv[2], settings)))

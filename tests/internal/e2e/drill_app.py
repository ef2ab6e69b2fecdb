"""A small application for ``saga drill``'s own tests: an order saga of three steps over
three participants, the last of which refuses one order in four (so that some sagas
compensate), and its drill hooks (``drill_participants``, ``drill_inputs``).

    python -m tests.internal.e2e.drill_app participant NAME

With ``DRILL_APP_BROKEN=1`` the ``card`` participant is broken the classic way: its
handler commits its effect on a connection of its own, outside the kit's transaction,
then fails; the kit runs it again, and the effect (with its ledger row) is applied twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator

import asyncpg
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, Settings, run
from saga_engine.participant import Participant, Rejected, Transaction

PARTICIPANTS = ("stock", "card", "mail")


class OrderInput(BaseModel):
    order: int
    refuse: bool = False  # the last participant refuses it: the saga compensates


class OrderDone(BaseModel):
    steps: int


class Do(BaseModel):
    order: int
    refuse: bool = False


class Undo(BaseModel):
    order: int


class Done(BaseModel):
    by: str


class DrillOrder(Saga[OrderInput, OrderDone]):
    name = "drill-order"

    async def run(self, ctx: SagaContext, req: OrderInput) -> OrderDone:
        return await order_steps(ctx, req, timeout=5)


async def order_steps(ctx: SagaContext, req: OrderInput, *, timeout: float | None) -> OrderDone:
    """The order's three steps, each with ``timeout`` (seconds, or none)."""
    for participant in PARTICIPANTS:
        await ctx.step(
            f"do-{participant}",
            to=participant,
            command=Do(order=req.order, refuse=req.refuse and participant == "mail"),
            compensate=Undo(order=req.order),
            timeout=timeout,
            returns=Done,
        )
    return OrderDone(steps=len(PARTICIPANTS))


def drill_participants() -> dict[str, list[str]]:
    return {
        name: ["-m", "tests.internal.e2e.drill_app", "participant", name] for name in PARTICIPANTS
    }


def drill_inputs() -> Iterator[OrderInput]:
    n = 0
    while True:
        yield OrderInput(order=n, refuse=n % 4 == 3)
        n += 1


_OUTSIDE = """
INSERT INTO drill_ledger (command_id, command_type, saga_id, step, compensation)
VALUES ($1, $2, $3, $4, $5)
"""


def build_participant(name: str, settings: Settings) -> Participant:
    participant = Participant(name, settings)
    broken = name == "card" and os.environ.get("DRILL_APP_BROKEN") == "1"

    @participant.handles(Do)
    async def do(cmd: Do, tx: Transaction) -> Done:
        if cmd.refuse:
            raise Rejected(f"{name} refuses order {cmd.order}")
        if broken and tx.attempt == 1:
            # The bug under test: the effect committed outside the kit's transaction,
            # then a failure; the kit's retry applies it a second time.
            conn = await asyncpg.connect(
                settings.participant.dsn.get_secret_value(),
                server_settings={"search_path": settings.participant.db_schema},
            )
            try:
                await conn.execute(
                    _OUTSIDE, tx.command_id, tx.command_type, tx.saga_id, tx.step, False
                )
            finally:
                await conn.close()
            raise RuntimeError("connection lost after the effect was committed")
        return Done(by=name)

    @participant.handles(Undo)
    async def undo(cmd: Undo, tx: Transaction) -> Done:
        return Done(by=name)

    return participant


async def _run_participant(name: str) -> None:
    participant = build_participant(name, Settings())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await participant.start()
    try:
        await stop.wait()
    finally:
        await participant.stop()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "participant":
        sys.exit("usage: python -m tests.internal.e2e.drill_app participant NAME")
    run(_run_participant(sys.argv[2]))

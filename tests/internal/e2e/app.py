"""The application used by the crash and multi-instance tests: sagas and participants.

Three ledger participants ("alpha", "beta", "gamma") record every applied command in
their own database schema, in a table with no uniqueness on the command id: a
duplicated effect shows up as a second row instead of being hidden by a constraint.

    saga worker tests.internal.e2e.app                   # an engine process
    python -m tests.internal.e2e.app participant alpha   # a participant process

With ``E2E_BATCH_HANDLERS=1`` a participant answers its commands with batch handlers
(``handles_batch``: one unnest insert per group) instead of one handler call per command.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import timedelta

from pydantic import BaseModel

from saga_engine import Saga, SagaContext, Settings, run
from saga_engine.kernel._crash import crash_hook
from saga_engine.participant import CommandBatch, Participant, Rejected, Transaction

PARTICIPANTS = ("alpha", "beta", "gamma")


class TransferRequest(BaseModel):
    amount: int
    fail_at: str | None = None  # the participant that refuses its step
    pause_s: float = 0.0  # a durable sleep between the steps, to keep sagas in flight


class TransferDone(BaseModel):
    receipts: list[str]


class Apply(BaseModel):
    amount: int
    refuse: bool = False


class Revert(BaseModel):
    amount: int


class Applied(BaseModel):
    receipt: str


class Transfer(Saga[TransferRequest, TransferDone]):
    name = "transfer"

    async def run(self, ctx: SagaContext, req: TransferRequest) -> TransferDone:
        receipts: list[str] = []
        for i, participant in enumerate(PARTICIPANTS):
            if i and req.pause_s:
                await ctx.sleep(timedelta(seconds=req.pause_s))
            reply = await ctx.step(
                f"apply-{participant}",
                to=participant,
                command=Apply(amount=req.amount, refuse=req.fail_at == participant),
                compensate=Revert(amount=req.amount),
                timeout=5,
                returns=Applied,
            )
            receipts.append(reply.receipt)
        return TransferDone(receipts=receipts)


class PayoutRequest(BaseModel):
    amounts: list[int]
    refuse_after: bool = False  # a last step refused after the children completed
    pause_s: float = 0.0


class PayoutDone(BaseModel):
    receipts: list[str]


class Payout(Saga[PayoutRequest, PayoutDone]):
    """A parent: one Transfer child per amount, then (maybe) a refused last step, which
    makes it compensate: its completed children are undone, last first."""

    name = "payout"

    async def run(self, ctx: SagaContext, req: PayoutRequest) -> PayoutDone:
        receipts: list[str] = []
        for i, amount in enumerate(req.amounts):
            done = await ctx.child(
                Transfer,
                TransferRequest(amount=amount, pause_s=req.pause_s),
                id=f"transfer-{i}",
                poll=5,
            )
            receipts += done.receipts
        if req.refuse_after:
            await ctx.step("settle", to="alpha", command=Apply(amount=0, refuse=True), timeout=5)
        return PayoutDone(receipts=receipts)


#: Created by the test harness in each participant's schema before it starts.
LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS ledger (
    id bigserial PRIMARY KEY,
    command_id text NOT NULL,
    saga_id text NOT NULL,
    kind text NOT NULL,
    amount int NOT NULL,
    at timestamptz NOT NULL DEFAULT now()
)
"""


def build_participant(name: str, settings: Settings) -> Participant:
    participant = Participant(
        name, settings, crash_hook=crash_hook(os.environ.get("SAGA_CRASH_AT"))
    )
    if os.environ.get("E2E_BATCH_HANDLERS") == "1":
        _batch_handlers(participant, name)
        return participant

    @participant.handles(Apply)
    async def apply(cmd: Apply, tx: Transaction) -> Applied:
        await tx.execute(
            "INSERT INTO ledger (command_id, saga_id, kind, amount) VALUES ($1, $2, 'apply', $3)",
            tx.command_id,
            tx.saga_id,
            cmd.amount,
        )
        if cmd.refuse:
            raise Rejected(f"{name} refuses transfers today")
        return Applied(receipt=f"{name}:{tx.command_id[:8]}")

    @participant.handles(Revert)
    async def revert(cmd: Revert, tx: Transaction) -> Applied:
        await tx.execute(
            "INSERT INTO ledger (command_id, saga_id, kind, amount) VALUES ($1, $2, 'revert', $3)",
            tx.command_id,
            tx.saga_id,
            cmd.amount,
        )
        return Applied(receipt=f"{name}:revert")

    return participant


_INSERT_MANY = """
INSERT INTO ledger (command_id, saga_id, kind, amount)
SELECT c, s, $3, a FROM unnest($1::text[], $2::text[], $4::int[]) AS x(c, s, a)
"""


def _batch_handlers(participant: Participant, name: str) -> None:
    @participant.handles_batch(Apply)
    async def apply(batch: CommandBatch[Apply]) -> list[Applied | Rejected]:
        # A refused command is answered Rejected and gets no row: nothing written for it.
        ok = [c for c in batch if not c.command.refuse]
        await batch.execute(
            _INSERT_MANY,
            [c.command_id for c in ok],
            [c.saga_id for c in ok],
            "apply",
            [c.command.amount for c in ok],
        )
        return [
            Rejected(f"{name} refuses transfers today")
            if c.command.refuse
            else Applied(receipt=f"{name}:{c.command_id[:8]}")
            for c in batch
        ]

    @participant.handles_batch(Revert)
    async def revert(batch: CommandBatch[Revert]) -> list[Applied]:
        await batch.execute(
            _INSERT_MANY,
            [c.command_id for c in batch],
            [c.saga_id for c in batch],
            "revert",
            [c.command.amount for c in batch],
        )
        return [Applied(receipt=f"{name}:revert") for _ in batch]


async def _run_participant(name: str) -> None:
    settings = Settings()
    participant = build_participant(name, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await participant.start()
    print(f"participant {name} running", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        await participant.stop()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "participant":
        sys.exit("usage: python -m tests.internal.e2e.app participant NAME")
    run(_run_participant(sys.argv[2]))

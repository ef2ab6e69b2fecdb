"""The application of the payload-codec tests: a saga whose input, command, reply, signal
and output all carry the caller's secret, and the participant that answers it.

    saga worker tests.internal.e2e.codec_app                  # an engine process
    python -m tests.internal.e2e.codec_app participant vault  # the participant process

Both read the codec from ``SAGA_CODEC__*`` like any deployment.
"""

from __future__ import annotations

import sys
from datetime import timedelta

from pydantic import BaseModel

from saga_engine import Saga, SagaContext, Settings, Signal, run
from saga_engine.participant import Participant, Rejected, Transaction
from tests.internal.e2e.participant_main import serve_participant

PARTICIPANT = "vault"

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS kept (
    command_id text NOT NULL,
    kind text NOT NULL
)
"""


class Deposit(BaseModel):
    secret: str
    #: A durable sleep between the two steps, to keep the saga in flight.
    pause_s: float = 0.0
    #: The participant refuses the second step, with the secret in the refusal's
    #: details: the saga compensates the first, and fails with those details.
    refuse_second: bool = False


class Approval(BaseModel):
    note: str


class Keep(BaseModel):
    secret: str
    part: int
    refuse: bool = False


class Forget(BaseModel):
    secret: str


class Kept(BaseModel):
    receipt: str


class Deposited(BaseModel):
    receipts: list[str]
    note: str


class Vault(Saga[Deposit, Deposited]):
    name = "vault"
    approval = Signal(Approval)

    async def run(self, ctx: SagaContext, req: Deposit) -> Deposited:
        receipts = []
        for part in (1, 2):
            if part == 2 and req.pause_s:
                await ctx.sleep(timedelta(seconds=req.pause_s))
            kept = await ctx.step(
                f"keep-{part}",
                to=PARTICIPANT,
                command=Keep(secret=req.secret, part=part, refuse=req.refuse_second and part == 2),
                compensate=Forget(secret=req.secret),
                timeout=5,
                returns=Kept,
            )
            receipts.append(kept.receipt)
        approval = await ctx.wait_signal(self.approval, timeout=timedelta(minutes=5))
        return Deposited(receipts=receipts, note=approval.note)


class Trust(BaseModel):
    secret: str


class Trustee(Saga[Trust, Deposited]):
    """A parent: its vault is a child saga (the secret in the child's start, its output
    in the child's answer), then a refused step makes it undo the completed child."""

    name = "trustee"

    async def run(self, ctx: SagaContext, trust: Trust) -> Deposited:
        kept = await ctx.child(Vault, Deposit(secret=trust.secret), id="vault", poll=5)
        await ctx.step(
            "seal",
            to=PARTICIPANT,
            command=Keep(secret=trust.secret, part=3, refuse=True),
            timeout=5,
        )
        return kept


def build_participant(settings: Settings) -> Participant:
    participant = Participant(PARTICIPANT, settings)

    @participant.handles(Keep)
    async def keep(cmd: Keep, tx: Transaction) -> Kept:
        # The business table holds no secret: the scan looks for leaks of the kit.
        await tx.execute("INSERT INTO kept (command_id, kind) VALUES ($1, 'keep')", tx.command_id)
        if cmd.refuse:
            raise Rejected("the vault is full", details={"secret": cmd.secret})
        return Kept(receipt=f"receipt-{cmd.part}-for-{cmd.secret}")

    @participant.handles(Forget)
    async def forget(cmd: Forget, tx: Transaction) -> Kept:
        await tx.execute("INSERT INTO kept (command_id, kind) VALUES ($1, 'forget')", tx.command_id)
        return Kept(receipt="forgotten")

    return participant


if __name__ == "__main__":
    if sys.argv[1:] != ["participant", PARTICIPANT]:
        sys.exit(f"usage: python -m tests.internal.e2e.codec_app participant {PARTICIPANT}")
    run(serve_participant(build_participant))

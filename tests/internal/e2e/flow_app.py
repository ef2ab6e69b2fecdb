"""The application of the flow-control tests (``test_flow.py``): one saga with one
step to the ``slow`` participant, which records every command it handles in its own
table, with the id of the transaction that handled it. The participant kit handles
a batch of commands in one transaction and replies after it commits, so the rows of
one transaction are commands the participant held at the same time: a concurrency
limit of n means no transaction has more than n.

    saga worker tests.internal.e2e.flow_app                   # an engine process
    python -m tests.internal.e2e.flow_app participant         # the participant
"""

from __future__ import annotations

import sys

from pydantic import BaseModel

from saga_engine import Cost, Saga, SagaContext, Settings, run
from saga_engine.participant import Participant, Transaction
from tests.internal.e2e.participant_main import serve_participant

PARTICIPANT = "slow"


class FlowJob(BaseModel):
    hold_s: float = 0.0
    #: The step's cost in cpu (none: it costs nothing of a budget).
    cpu: float | None = None


class FlowDone(BaseModel):
    ok: bool = True


class Hold(BaseModel):
    hold_s: float


class Release(BaseModel):
    pass


class Ok(BaseModel):
    ok: bool = True


class Flowed(Saga[FlowJob, FlowDone]):
    name = "flowed"

    async def run(self, ctx: SagaContext, job: FlowJob) -> FlowDone:
        await ctx.step(
            "hold",
            to=PARTICIPANT,
            command=Hold(hold_s=job.hold_s),
            compensate=Release(),
            timeout=10,
            returns=Ok,
            cost=Cost(cpu=job.cpu) if job.cpu else None,
        )
        return FlowDone()


#: Created by the test in the participant's schema before it starts. No uniqueness on
#: the command id: a duplicated effect is a second row.
LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS flow_ledger (
    id bigserial PRIMARY KEY,
    command_id text NOT NULL,
    saga_id text NOT NULL,
    kind text NOT NULL,
    txid bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def build_participant(settings: Settings) -> Participant:
    participant = Participant(PARTICIPANT, settings)

    @participant.handles(Hold)
    async def hold(cmd: Hold, tx: Transaction) -> Ok:
        await tx.execute(
            "INSERT INTO flow_ledger (command_id, saga_id, kind, txid) "
            "VALUES ($1, $2, 'apply', txid_current())",
            tx.command_id,
            tx.saga_id,
        )
        if cmd.hold_s:
            await tx.execute("SELECT pg_sleep($1)", cmd.hold_s)
        return Ok()

    @participant.handles(Release)
    async def release(cmd: Release, tx: Transaction) -> Ok:
        await tx.execute(
            "INSERT INTO flow_ledger (command_id, saga_id, kind, txid) "
            "VALUES ($1, $2, 'revert', txid_current())",
            tx.command_id,
            tx.saga_id,
        )
        return Ok()

    return participant


if __name__ == "__main__":
    if sys.argv[1:] != ["participant"]:
        sys.exit("usage: python -m tests.internal.e2e.flow_app participant")
    run(serve_participant(build_participant))

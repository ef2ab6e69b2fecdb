"""The application of the per-key concurrency tests (``test_keys.py``): two saga types
limited per ``account`` (``locked``: one at a time, ``paired``: two), each entering and
leaving the ``keys`` participant, which records both in its own table with the time its
transaction handled them. While a saga holds its key, its enter and leave rows are
written; so per key, no more than the limit of [enter, leave] intervals may overlap.

    saga worker tests.internal.e2e.keys_app                   # an engine process
    python -m tests.internal.e2e.keys_app participant         # the participant
"""

from __future__ import annotations

import sys
from datetime import timedelta

from pydantic import BaseModel

from saga_engine import ConcurrencyLimit, Saga, SagaContext, Settings, run
from saga_engine.participant import Participant, Transaction
from tests.internal.e2e.participant_main import serve_participant

PARTICIPANT = "keys"


class Visit(BaseModel):
    account: str
    hold_s: float = 0.1


class Visited(BaseModel):
    ok: bool = True


class Enter(BaseModel):
    account: str
    lane: str


class Leave(BaseModel):
    account: str
    lane: str


class Ok(BaseModel):
    ok: bool = True


async def _visit(ctx: SagaContext, visit: Visit, lane: str) -> Visited:
    enter = Enter(account=visit.account, lane=lane)
    await ctx.step("enter", to=PARTICIPANT, command=enter, timeout=10, returns=Ok)
    await ctx.sleep(timedelta(seconds=visit.hold_s))
    leave = Leave(account=visit.account, lane=lane)
    await ctx.step("leave", to=PARTICIPANT, command=leave, timeout=10, returns=Ok)
    return Visited()


class Locked(Saga[Visit, Visited]):
    name = "locked"
    concurrency = ConcurrencyLimit(key="account", limit=1)

    async def run(self, ctx: SagaContext, visit: Visit) -> Visited:
        return await _visit(ctx, visit, "locked")


class Paired(Saga[Visit, Visited]):
    name = "paired"
    concurrency = ConcurrencyLimit(key="account", limit=2)

    async def run(self, ctx: SagaContext, visit: Visit) -> Visited:
        return await _visit(ctx, visit, "paired")


#: Created by the test in the participant's schema. No uniqueness on the command id:
#: a duplicated effect is a second row.
LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS key_ledger (
    id bigserial PRIMARY KEY,
    command_id text NOT NULL,
    saga_id text NOT NULL,
    lane text NOT NULL,
    account text NOT NULL,
    kind text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def build_participant(settings: Settings) -> Participant:
    participant = Participant(PARTICIPANT, settings)

    async def record(tx: Transaction, lane: str, account: str, kind: str) -> Ok:
        await tx.execute(
            "INSERT INTO key_ledger (command_id, saga_id, lane, account, kind) "
            "VALUES ($1, $2, $3, $4, $5)",
            tx.command_id,
            tx.saga_id,
            lane,
            account,
            kind,
        )
        return Ok()

    @participant.handles(Enter)
    async def enter(cmd: Enter, tx: Transaction) -> Ok:
        return await record(tx, cmd.lane, cmd.account, "enter")

    @participant.handles(Leave)
    async def leave(cmd: Leave, tx: Transaction) -> Ok:
        return await record(tx, cmd.lane, cmd.account, "leave")

    return participant


if __name__ == "__main__":
    if sys.argv[1:] != ["participant"]:
        sys.exit("usage: python -m tests.internal.e2e.keys_app participant")
    run(serve_participant(build_participant))

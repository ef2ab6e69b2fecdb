"""The drill's ledger: with ``SAGA_PARTICIPANT__DRILL_LEDGER=1`` the kit records each
command it applied (a success reply) in ``drill_ledger``, in the participant's schema,
inside the transaction that applies it; ``saga drill`` counts applications per command
id there. No uniqueness on the command id: a second application must show as a second
row, not be hidden by a constraint."""

from __future__ import annotations

from collections.abc import Sequence

from saga_engine.participant._sql import Connection
from saga_engine.transport._wire import Envelope

LEDGER_TABLE = "drill_ledger"

LEDGER_DDL = f"""
CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (
    command_id   text        NOT NULL,
    command_type text        NOT NULL,
    saga_id      text        NOT NULL,
    step         text        NOT NULL,
    compensation boolean     NOT NULL,
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    seq          bigserial
)
"""

_INSERT = f"""
INSERT INTO {LEDGER_TABLE} (command_id, command_type, saga_id, step, compensation)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::boolean[])
"""


async def create_ledger(conn: Connection) -> None:
    """The ledger table in the connection's search path (idempotent)."""
    await conn.execute(LEDGER_DDL)


async def record_applications(conn: Connection, commands: Sequence[Envelope]) -> None:
    """One ledger row per applied command, on ``conn`` (its transaction)."""
    if not commands:
        return
    await conn.execute(
        _INSERT,
        [c.command_id for c in commands],
        [c.subject for c in commands],
        [c.saga_id for c in commands],
        [c.step for c in commands],
        [c.compensation for c in commands],
    )

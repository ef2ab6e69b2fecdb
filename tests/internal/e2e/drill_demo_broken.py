"""The demo's checkout drilled with a deliberately broken payments service: its
``ReserveCredit`` handler commits the reservation (and its ledger row) on a connection of
its own, outside the kit's transaction, then fails; the kit runs it again and the credit
is reserved, and the command applied, twice. Everything else is ``services_demo.drill``.

    saga drill --sagas services_demo.sagas --participants tests.internal.e2e.drill_demo_broken ...
"""

from __future__ import annotations

import asyncpg

from saga_engine import Settings
from saga_engine.participant import Participant, Transaction
from services_demo import payments
from services_demo.contracts import CreditReserved, ReleaseCredit, ReserveCredit
from services_demo.drill import drill_env, drill_events, drill_inputs, service_args
from services_demo.drill import drill_participants as demo_participants

__all__ = ["app", "drill_env", "drill_events", "drill_inputs", "drill_participants"]

_RESERVE = """
WITH taken AS (
    UPDATE customers SET balance = balance - $3 WHERE customer_id = $2 RETURNING balance
)
INSERT INTO reservations (order_id, customer_id, amount, status)
VALUES ($1, $2, $3, 'reserved')
ON CONFLICT (order_id) DO UPDATE SET amount = reservations.amount + excluded.amount
"""

_OUTSIDE = """
INSERT INTO drill_ledger (command_id, command_type, saga_id, step, compensation)
VALUES ($1, $2, $3, $4, false)
"""


def broken_participant(settings: Settings) -> Participant:
    participant = Participant("payments", settings)

    @participant.handles(ReserveCredit)
    async def reserve(cmd: ReserveCredit, tx: Transaction) -> CreditReserved:
        if tx.attempt == 1:
            # The bug under test: the effect committed outside the kit's transaction,
            # then a failure; the kit's retry applies it a second time.
            conn = await asyncpg.connect(
                settings.participant.dsn.get_secret_value(),
                server_settings={"search_path": settings.participant.db_schema},
            )
            try:
                async with conn.transaction():
                    await conn.execute(_RESERVE, cmd.order_id, cmd.customer, cmd.amount)
                    await conn.execute(
                        _OUTSIDE, tx.command_id, tx.command_type, tx.saga_id, tx.step
                    )
            finally:
                await conn.close()
            raise RuntimeError("connection lost after the reservation was committed")
        await tx.execute(_RESERVE, cmd.order_id, cmd.customer, cmd.amount)
        return CreditReserved(order_id=cmd.order_id, amount=cmd.amount, balance=0)

    participant.handles(ReleaseCredit)(payments.release_credit)
    return participant


app = payments.create_app(participant=broken_participant)


def drill_participants() -> dict[str, list[str]]:
    found = demo_participants()
    found["payments"] = service_args("payments", app=f"{__name__}:app")
    return found

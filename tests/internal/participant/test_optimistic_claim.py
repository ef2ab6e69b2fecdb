"""The optimistic claim on the real Postgres and Kafka: a handler whose every effect is a
write in its transaction (``effects="transaction"``, the default) is claimed by its
outcome's insert alone (``INSERT ... WHERE NOT EXISTS ... RETURNING``), with no lock
and no read of the stored replies. A copy whose outcome another transaction stored finds
the row at that insert: its transaction is rolled back, and the locked way answers it
from the stored reply. Effects are counted in the participant's own table (the ledger,
which has no uniqueness on the command id), never in memory.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel

from saga_engine.participant import Participant, Transaction
from tests.participant import test_participant
from tests.participant.helpers import (
    by_id,
    command,
    compensation_of,
    query,
    resent,
    send_first,
    start,
)
from tests.participant.test_participant import World, body_of
from tests.waiting import eventually

pytestmark = pytest.mark.integration

world = test_participant.world


class Book(BaseModel):
    amount: int


class Unbook(BaseModel):
    amount: int


def booking(
    gate: asyncio.Event | None = None, entered: Counter[str] | None = None
) -> Callable[[Participant], None]:
    """Registers Book and Unbook, whose only effect is a ledger row. ``gate``: Book waits
    for it after its write (``entered`` counts who got there: the test's view, no effect
    the kit is told of)."""

    def register(participant: Participant) -> None:
        @participant.handles(Book)
        async def book(cmd: Book, tx: Transaction) -> dict[str, Any]:
            await tx.execute(
                "INSERT INTO ledger (command_id, amount) VALUES ($1, $2)", tx.command_id, cmd.amount
            )
            if gate is not None:
                assert entered is not None
                entered[tx.command_id] += 1
                await gate.wait()
            return {"booked": cmd.amount, "by": participant.instance_id}

        @participant.handles(Unbook)
        async def unbook(cmd: Unbook, tx: Transaction) -> None:
            await tx.execute(
                "INSERT INTO ledger (command_id, amount) VALUES ($1, $2)",
                tx.command_id,
                -cmd.amount,
            )

    return register


async def test_a_copy_sent_again_is_applied_once_and_answered_from_the_stored_reply(
    world: World,
) -> None:
    participant = await start(world, register=booking())
    cmd = command("Book", {"amount": 5})
    await world.bus.send(cmd)
    await world.bus.wait_replies(1)
    await world.bus.send(resent(cmd))
    first, second = await world.bus.wait_replies(2)

    assert await world.ledger() == [(cmd.command_id, 5)]
    assert body_of(first) == body_of(second)
    assert body_of(first).outcome == "success"
    # The copy's optimistic pass found the row, rolled back, and went the locked way.
    assert participant.stats["claims_lost"] == 1
    assert (participant.stats["processed"], participant.stats["duplicates"]) == (1, 1)


async def test_two_instances_racing_one_command_apply_it_once_and_answer_the_same(
    world: World,
) -> None:
    """The same command on two instances at once, both handlers inside their optimistic
    transactions, each with its ledger row written: one insert of the outcome wins, the
    other waits for it on the unique index, finds the row, rolls its write back and
    answers with the winner's stored reply."""
    gate = asyncio.Event()
    entered: Counter[str] = Counter()
    first = await start(world, register=booking(gate, entered))
    second = await start(world, register=booking(gate, entered))

    async def split() -> bool:
        return first.assignment | second.assignment == {0, 1} and not (
            first.assignment & second.assignment
        )

    await eventually(split)
    cmd = command("Book", {"amount": 7})
    await world.bus.send(cmd, partition=0)
    await world.bus.send(resent(cmd), partition=1)

    async def both_inside() -> bool:
        return entered[cmd.command_id] == 2

    await eventually(both_inside)
    gate.set()
    replies = await world.bus.wait_replies(2)

    assert await world.ledger() == [(cmd.command_id, 7)]
    assert body_of(replies[0]) == body_of(replies[1])
    stats = first.stats + second.stats
    assert (stats["processed"], stats["duplicates"], stats["claims_lost"]) == (1, 1, 1)
    stored = await world.processed(cmd.command_id)
    assert stored is not None
    assert stored["outcome"] == "success"


async def test_a_forward_command_after_its_compensation_finds_the_tombstone(
    world: World,
) -> None:
    """The compensation goes the locked way (it tombstones its forward command first);
    the late forward command's optimistic insert meets the tombstone: its write rolls
    back and it is answered as compensated."""
    participant = await start(world, register=booking())
    forward = command("Book", {"amount": 30}, step="book")
    undo = compensation_of(forward, "Unbook", {"amount": 30}, "undo-1")
    await world.bus.send(undo)
    await world.bus.wait_replies(1)
    await world.bus.send(forward)
    late = by_id(await world.bus.wait_replies(2))[forward.command_id]

    assert (body_of(late).outcome, body_of(late).error) == (
        "failure",
        "compensated before it arrived",
    )
    assert await world.ledger() == [("undo-1", -30)]
    assert participant.stats["claims_lost"] == 1


class Seat(BaseModel):
    seat: str


async def test_a_copy_whose_handler_raises_on_the_first_ones_row_is_answered_not_retried(
    world: World,
) -> None:
    """A handler that inserts a business key with no ON CONFLICT: on a copy, run in the
    optimistic pass, it raises a unique violation on the row the first one committed.
    That is no failure: the run holds a copy whose outcome is stored, so the locked way
    answers it from the stored reply, with no attempt counted."""
    await query(world.pg.dsn, "CREATE TABLE seats (seat text PRIMARY KEY, command_id text)")

    def register(participant: Participant) -> None:
        @participant.handles(Seat)
        async def take(cmd: Seat, tx: Transaction) -> dict[str, str]:
            await tx.execute("INSERT INTO seats VALUES ($1, $2)", cmd.seat, tx.command_id)
            return {"seat": cmd.seat}

    participant = await start(world, register=register)
    cmd = command("Seat", {"seat": "12A"})
    await world.bus.send(cmd)
    await world.bus.wait_replies(1)
    await world.bus.send(resent(cmd))
    first, second = await world.bus.wait_replies(2)

    assert body_of(first) == body_of(second)
    assert body_of(second).outcome == "success"
    rows = await query(world.pg.dsn, "SELECT seat, command_id FROM seats")
    assert [(r["seat"], r["command_id"]) for r in rows] == [("12A", cmd.command_id)]
    assert participant.stats["handler_errors"] == 0
    assert (participant.stats["processed"], participant.stats["duplicates"]) == (1, 1)


# --------------------------------------------------------------------------- round trips

BATCH = 5


@pytest.mark.parametrize(
    ("effects", "extra"),
    [
        ("transaction", []),
        # The locked way's two more: the claim (advisory locks) and the stored replies.
        ("outside", ["pg_advisory_xact_lock", "FROM saga_processed_commands"]),
    ],
)
async def test_a_batch_makes_two_statements_fewer_on_the_optimistic_claim(
    world: World, monkeypatch: pytest.MonkeyPatch, effects: str, extra: list[str]
) -> None:
    """Every statement the participant's pool sends (asyncpg's query logger), from a
    batch's BEGIN to its COMMIT: BEGIN, a handler's INSERT per command, the outcomes'
    insert, COMMIT; the locked way adds its claim and its read of the stored replies.
    A statement is one round trip (a cold prepared statement adds one, once per
    connection). The pool's reset query after the batch is one more either way."""
    logged: list[str] = []
    create_pool = asyncpg.create_pool

    def logging_pool(*args: Any, **kwargs: Any) -> Any:
        async def init(conn: asyncpg.Connection) -> None:
            conn.add_query_logger(lambda q: logged.append(" ".join(q.query.split())))

        return create_pool(*args, init=init, **kwargs)

    monkeypatch.setattr(asyncpg, "create_pool", logging_pool)

    def register(participant: Participant) -> None:
        @participant.handles(Book, effects=effects)  # type: ignore[arg-type]
        async def book(cmd: Book, tx: Transaction) -> dict[str, int]:
            await tx.execute(
                "INSERT INTO ledger (command_id, amount) VALUES ($1, $2)", tx.command_id, cmd.amount
            )
            return {"booked": cmd.amount}

    commands = [command("Book", {"amount": i}) for i in range(BATCH)]
    await send_first(world, *commands)
    await start(world, register=register, relay_interval_s=3600)
    await world.bus.wait_replies(BATCH)
    await eventually(lambda: _batch_of(logged), until=lambda b: b is not None)

    batch = _batch_of(logged)
    assert batch is not None
    begin, *inside, commit = batch
    assert begin.startswith("BEGIN ISOLATION LEVEL READ COMMITTED")
    assert commit.startswith("COMMIT")
    handler = [s for s in inside if s.startswith("INSERT INTO ledger")]
    outcomes = [s for s in inside if s.startswith("INSERT INTO saga_processed_commands")]
    assert (len(handler), len(outcomes)) == (BATCH, 1), batch
    others = [s for s in inside if s not in handler + outcomes]
    assert [_which(s, extra) for s in others] == extra, batch
    assert len(batch) == BATCH + 3 + len(extra)
    print(f"effects={effects}: {len(batch)} statements for {BATCH} commands:", *batch, sep="\n  ")


def _batch_of(logged: list[str]) -> list[str] | None:
    """The statements of the first committed transaction that stored outcomes."""
    start: int | None = None
    for i, statement in enumerate(logged):
        if statement.startswith("BEGIN"):
            start = i
        elif statement.startswith("COMMIT") and start is not None:
            batch = logged[start : i + 1]
            if any("saga_processed_commands" in s for s in batch):
                return batch
            start = None
    return None


def _which(statement: str, marks: list[str]) -> str:
    """The mark ``statement`` holds (itself if none)."""
    return next((m for m in marks if m in statement), statement)

"""Batch handlers (``Participant.handles_batch``) on the real Postgres and Kafka: one call
answers the commands of its type in a consumed batch, and each command still gets what it
would get alone: applied once, its own answer, its saga's order kept.

As in the batch tests, each test sends its commands to partition 0 BEFORE the participant
starts, so that its first fetch takes them together; the handlers record the command ids
of every call, and each test asserts the calls it expects (a fetch that split the
commands fails the test rather than pass it untested).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from saga_engine import DefinitionError, Settings
from saga_engine.participant import CommandBatch, Participant, Rejected, Retryable, Transaction
from saga_engine.protocol import Envelope, ReplyBody
from tests.participant import test_participant
from tests.participant.helpers import (
    OUTSIDE,
    TRACEPARENT,
    by_id,
    command,
    compensation_of,
    resent,
    send_first,
    start,
)
from tests.participant.test_participant import SimulatedCrash, World, body_of

pytestmark = pytest.mark.integration

# The participant tests' world: a ledger participant over the real Kafka and Postgres.
world = test_participant.world

INSERT = "INSERT INTO ledger (command_id, amount) SELECT * FROM unnest($1::text[], $2::int[])"


class Apply(BaseModel):
    amount: int
    refuse: bool = False  # answered Rejected, nothing written
    busy: bool = False  # answered Retryable, nothing written
    poison: bool = False  # the handler raises whenever this command is in its call


class Revert(BaseModel):
    amount: int


class Short(BaseModel):
    """Its handler returns one entry too few for a call that holds a command with
    ``always``."""

    always: bool = False


Calls = list[tuple[str, list[str]]]


def batch_handlers(world: World, calls: Calls) -> Callable[[Participant], None]:
    """Registers the batch handlers, which record each call's type and command ids (in
    memory, outside their transaction: ``effects=OUTSIDE``)."""

    def register(participant: Participant) -> None:
        @participant.handles_batch(Apply, effects=OUTSIDE)
        async def apply(batch: CommandBatch[Apply]) -> list[dict[str, Any] | Rejected | Retryable]:
            calls.append(("Apply", [c.command_id for c in batch]))
            for c in batch:
                world.effects.calls[c.command_id] += 1
            if any(c.command.poison for c in batch):
                raise RuntimeError("poisoned")
            ok = [c for c in batch if not (c.command.refuse or c.command.busy)]
            await batch.execute(INSERT, [c.command_id for c in ok], [c.command.amount for c in ok])
            return [
                Rejected("insufficient credit", details={"requested": c.command.amount})
                if c.command.refuse
                else Retryable("busy", after=timedelta(seconds=2.5))
                if c.command.busy
                else {"receipt": f"r-{c.command_id}", "attempt": c.attempt}
                for c in batch
            ]

        @participant.handles_batch(Revert, effects=OUTSIDE)
        async def revert(batch: CommandBatch[Revert]) -> list[None]:
            calls.append(("Revert", [c.command_id for c in batch]))
            await batch.execute(
                INSERT, [c.command_id for c in batch], [-c.command.amount for c in batch]
            )
            return [None] * len(batch)

        @participant.handles_batch(Short, effects=OUTSIDE)
        async def short(batch: CommandBatch[Short]) -> list[None]:
            calls.append(("Short", [c.command_id for c in batch]))
            await batch.execute(INSERT, [c.command_id for c in batch], [0] * len(batch))
            if any(c.command.always for c in batch):
                return [None] * (len(batch) - 1)
            return [None] * len(batch)

    return register


async def run(world: World, *envelopes: Envelope, **options: Any) -> tuple[Participant, Calls]:
    """Sends ``envelopes`` as one batch, then starts the participant."""
    calls: Calls = []
    await send_first(world, *envelopes)
    participant = await start(world, register=batch_handlers(world, calls), **options)
    return participant, calls


def ids(*envelopes: Envelope) -> list[str]:
    return [e.command_id for e in envelopes]


# --------------------------------------------------------------------------- grouping


async def test_one_call_answers_every_command_of_its_type_in_a_batch(world: World) -> None:
    applies = [command("Apply", {"amount": i}) for i in range(1, 6)]
    seen: list[Any] = []

    def register(participant: Participant) -> None:
        @participant.handles_batch(Apply, name="Seen")
        async def fields(batch: CommandBatch[Apply]) -> list[None]:
            seen.extend(batch)
            return [None] * len(batch)

    await send_first(world, *applies, command("Seen", {"amount": 9}, step="seen"))
    calls: Calls = []

    def both(participant: Participant) -> None:
        batch_handlers(world, calls)(participant)
        register(participant)

    participant = await start(world, register=both)
    replies = by_id(await world.bus.wait_replies(6))

    assert calls == [("Apply", ids(*applies))]
    assert await world.ledger() == [(a.command_id, i) for i, a in enumerate(applies, 1)]
    for a in applies:
        assert body_of(replies[a.command_id]) == ReplyBody(
            outcome="success", payload={"receipt": f"r-{a.command_id}", "attempt": 1}
        )
        stored = await world.processed(a.command_id)
        assert stored is not None
        assert stored["outcome"] == "success"
    # Each command has its own span: its reply continues the command's trace.
    for reply, headers in zip(world.bus.replies, world.bus.reply_headers, strict=True):
        assert headers["traceparent"].split("-")[1] == TRACEPARENT.split("-")[1], reply
    [one] = seen
    assert (one.command, one.step, one.saga_type, one.attempt) == (
        Apply(amount=9),
        "seen",
        "Checkout",
        1,
    )
    assert one.compensation is False
    assert one.trace_context["traceparent"].split("-")[1] == TRACEPARENT.split("-")[1]
    assert participant.stats["processed"] == 6
    assert participant.stats["batch_replays"] == 0


def test_a_batch_handler_that_cannot_work_is_refused_at_registration() -> None:
    participant = Participant("checks", Settings())

    async def fine(batch: CommandBatch[Apply]) -> list[None]:
        return [None] * len(batch)

    def not_async(batch: CommandBatch[Apply]) -> list[None]:
        return []

    with pytest.raises(DefinitionError, match="handles_batch\\(\\) takes the command's pydantic"):
        participant.handles_batch(dict)  # type: ignore[type-var]
    with pytest.raises(DefinitionError, match=r"async function \(async def handler\(batch\)"):
        participant.handles_batch(Apply)(not_async)  # type: ignore[arg-type]
    participant.handles(Apply)(single_apply)
    with pytest.raises(DefinitionError, match="already has a handler for Apply"):
        participant.handles_batch(Apply)(fine)
    assert participant.handles_batch(Apply, name="Other")(fine) is fine
    assert participant.command_types == ["Apply", "Other"]


async def single_apply(cmd: Apply, tx: Transaction) -> None:
    return None


# --------------------------------------------------------------------------- answers


async def test_a_returned_rejection_answers_its_command_alone(world: World) -> None:
    first = command("Apply", {"amount": 10})
    refused = command("Apply", {"amount": 500, "refuse": True})
    last = command("Apply", {"amount": 20})
    participant, calls = await run(world, first, refused, last)
    replies = by_id(await world.bus.wait_replies(3))

    assert calls == [("Apply", ids(first, refused, last))]
    assert await world.ledger() == [(first.command_id, 10), (last.command_id, 20)]
    refusal = body_of(replies[refused.command_id])
    assert (refusal.outcome, refusal.error) == ("failure", "insufficient credit")
    assert refusal.payload == {"requested": 500}
    for cmd in (first, last):
        assert body_of(replies[cmd.command_id]).outcome == "success"
    stored = await world.processed(refused.command_id)
    assert stored is not None
    assert (stored["outcome"], stored["error"]) == ("failure", "insufficient credit")
    # No pass was rolled back: the refusal needed no savepoint.
    assert participant.stats["batch_replays"] == 0
    assert participant.stats["rejected"] == 1

    # Stored like any answer: a copy gets it again, without the handler.
    await world.bus.send(resent(refused), partition=0)
    again = await world.bus.wait_replies(4)
    assert body_of(again[3]) == refusal
    assert world.effects.calls[refused.command_id] == 1
    assert len(calls) == 1


async def test_a_returned_retryable_answers_its_command_alone(world: World) -> None:
    first = command("Apply", {"amount": 5})
    busy = command("Apply", {"amount": 7, "busy": True})
    participant, calls = await run(world, first, busy)
    replies = by_id(await world.bus.wait_replies(2))

    assert calls == [("Apply", ids(first, busy))]
    assert body_of(replies[busy.command_id]) == ReplyBody(
        outcome="retryable", payload={"retry_after_s": 2.5}, error="busy (retry after 2.5s)"
    )
    assert body_of(replies[first.command_id]).outcome == "success"
    assert await world.ledger() == [(first.command_id, 5)]
    stored = await world.processed(busy.command_id)
    assert stored is not None
    assert stored["outcome"] == "retryable"
    assert participant.stats["retryable"] == 1
    assert participant.stats["handler_errors"] == 0


# --------------------------------------------------------------------------- raising


async def test_a_poisoned_command_is_retried_alone_and_its_neighbours_applied_once(
    world: World,
) -> None:
    applies = [command("Apply", {"amount": i, "poison": i == 3}) for i in range(1, 6)]
    poisoned = applies[2]
    participant, calls = await run(world, *applies)
    replies = by_id(await world.bus.wait_replies(5))

    assert calls[0] == ("Apply", ids(*applies))
    # Then each alone, until the poisoned one raised alone; after it, the others together.
    alone = [c for c in calls[1:] if c[1] == [poisoned.command_id]]
    assert len(alone) == 3  # settings.participant.handler_attempts
    assert calls[-1] == ("Apply", ids(*applies[3:]))
    answer = body_of(replies[poisoned.command_id])
    assert (answer.outcome, answer.error) == ("retryable", "RuntimeError: poisoned")
    for a in applies:
        if a is not poisoned:
            assert body_of(replies[a.command_id]).payload == {
                "receipt": f"r-{a.command_id}",
                "attempt": 1,
            }
    assert sorted(await world.ledger()) == sorted(
        (a.command_id, a.body["amount"]) for a in applies if a is not poisoned
    )
    assert world.effects.calls[poisoned.command_id] == 4  # in the group, then 3 attempts
    assert participant.stats["batch_handler_splits"] == 1
    assert participant.stats["handler_errors"] == 3
    assert participant.stats["retryable"] == 1
    assert participant.stats["processed"] == 5


async def test_a_wrong_number_of_entries_counts_as_raising(world: World) -> None:
    group = [command("Short", {}) for _ in range(3)]
    always = command("Short", {"always": True})
    participant, calls = await run(world, *group, always)
    replies = by_id(await world.bus.wait_replies(4))

    # The group's call failed (3 entries for 4); alone, ``always`` failed again, and
    # the three others were called together again.
    assert calls[0] == ("Short", ids(*group, always))
    assert ("Short", ids(*group)) in calls
    for cmd in group:
        assert body_of(replies[cmd.command_id]) == ReplyBody(outcome="success", payload={})
    answer = body_of(replies[always.command_id])
    assert answer.outcome == "retryable"
    assert answer.error is not None
    assert answer.error.startswith("TypeError: the batch handler for Short (")
    assert answer.error.endswith(
        "returned 0 entries for 1 command(s); it must return one per command, in order"
    )
    assert sorted(await world.ledger()) == sorted((c.command_id, 0) for c in group)
    assert participant.stats["batch_handler_splits"] == 1
    assert participant.stats["retryable"] == 1


# --------------------------------------------------------------------------- what never reaches it


async def test_duplicates_are_answered_from_the_stored_reply_without_the_handler(
    world: World,
) -> None:
    earlier = command("Apply", {"amount": 3})
    first, calls = await run(world, earlier)
    [reply] = await world.bus.wait_replies(1)
    await first.stop()
    world.running.clear()

    fresh = command("Apply", {"amount": 4})
    copies = [resent(earlier), fresh, resent(fresh), resent(fresh)]
    participant, calls = await run(world, *copies)
    replies = await world.bus.wait_replies(5)

    # The fresh command reached the handler once; the earlier one not at all.
    assert calls == [("Apply", [fresh.command_id])]
    # Each copy answered (the two sagas' replies may interleave: other inbox partitions).
    assert sorted(r.causation_id for r in replies[1:]) == sorted(c.id for c in copies)
    fresh_bodies = [body_of(r) for r in replies[1:] if r.command_id == fresh.command_id]
    assert fresh_bodies == [fresh_bodies[0]] * 3
    assert fresh_bodies[0].outcome == "success"
    assert [body_of(r) for r in replies[1:] if r.command_id == earlier.command_id] == [
        body_of(reply)
    ]
    assert world.effects.calls == {earlier.command_id: 1, fresh.command_id: 1}
    assert await world.ledger() == [(earlier.command_id, 3), (fresh.command_id, 4)]
    assert participant.stats["duplicates"] == 3
    assert participant.stats["processed"] == 1


async def test_a_forward_command_after_its_compensation_never_reaches_the_handler(
    world: World,
) -> None:
    forward = command("Apply", {"amount": 30}, step="pay")
    undo = compensation_of(forward, "Revert", {"amount": 30}, f"{forward.saga_id}:undo-pay")
    other = command("Apply", {"amount": 1})
    _, calls = await run(world, undo, forward, other)
    replies = by_id(await world.bus.wait_replies(3))

    assert calls == [("Revert", [undo.command_id]), ("Apply", [other.command_id])]
    late = body_of(replies[forward.command_id])
    assert (late.outcome, late.error) == ("failure", "compensated before it arrived")
    assert world.effects.calls[forward.command_id] == 0
    assert await world.ledger() == [(undo.command_id, -30), (other.command_id, 1)]


# --------------------------------------------------------------------------- order


async def test_a_sagas_commands_are_applied_in_record_order_whatever_the_grouping(
    world: World,
) -> None:
    """[A(s2), R(s1), A(s1), R(s2)]: grouped by type alone, A(s1) would be applied before
    R(s1), which came first. Each saga's commands are applied in record order."""
    a2 = command("Apply", {"amount": 2}, step="pay")
    r1 = compensation_of(command("Apply", {}, step="hold"), "Revert", {"amount": 1}, "s1-undo")
    a1 = command("Apply", {"amount": 1}, saga_id=r1.saga_id, step="pay")
    r2 = compensation_of(a2, "Revert", {"amount": 2}, f"{a2.saga_id}:undo-pay")
    participant, calls = await run(world, a2, r1, a1, r2)
    replies = by_id(await world.bus.wait_replies(4))

    assert calls == [("Revert", ids(r1)), ("Apply", ids(a2, a1)), ("Revert", ids(r2))]
    ledger = [c for c, _ in await world.ledger()]
    for saga in (a1.saga_id, a2.saga_id):
        in_record_order = [e.command_id for e in (a2, r1, a1, r2) if e.saga_id == saga]
        assert [c for c in ledger if c in in_record_order] == in_record_order
    assert all(body_of(r).outcome == "success" for r in replies.values())
    assert participant.stats["processed"] == 4


async def test_batch_and_single_handlers_share_a_batch_and_its_replay(world: World) -> None:
    """A single handler's refusal rolls the first pass back; the second (savepoints) calls
    the batch handler once, for all of its commands, and applies everything once."""
    a1 = command("Apply", {"amount": 1})
    r1 = command("Reserve", {"amount": 10})
    a2 = command("Apply", {"amount": 2})
    refused = command("Reserve", {"amount": 500})
    a3 = command("Apply", {"amount": 3})
    participant, calls = await run(world, a1, r1, a2, refused, a3)
    replies = by_id(await world.bus.wait_replies(5))

    assert calls == [("Apply", ids(a1, a2, a3))]
    assert world.effects.calls[r1.command_id] == 2  # its first pass rolled back
    assert world.effects.calls[refused.command_id] == 1
    assert sorted(await world.ledger()) == sorted(
        [(a1.command_id, 1), (r1.command_id, 10), (a2.command_id, 2), (a3.command_id, 3)]
    )
    assert body_of(replies[refused.command_id]).outcome == "failure"
    for cmd in (a1, r1, a2, a3):
        assert body_of(replies[cmd.command_id]).outcome == "success"
    assert participant.stats["batch_replays"] == 1
    assert participant.stats["rejected"] == 1
    assert participant.stats["processed"] == 5


# --------------------------------------------------------------------------- isolation


class Audit(BaseModel):
    n: int


async def test_a_batch_handler_at_another_isolation_level_answers_its_run_at_it(
    world: World,
) -> None:
    """[R, S1, S2, R'] where S's batch handler asks for SERIALIZABLE: S1 and S2 are one
    call, in a transaction of their own at that level, between R and R'."""
    levels: list[tuple[str, list[str]]] = []

    def register(participant: Participant) -> None:
        @participant.handles_batch(Audit, isolation="serializable")
        async def audit(batch: CommandBatch[Audit]) -> list[None]:
            level = await batch.fetchval("SHOW transaction_isolation")
            levels.append((level, [c.command_id for c in batch]))
            await batch.execute(INSERT, [c.command_id for c in batch], [c.command.n for c in batch])
            return [None] * len(batch)

    before = command("Reserve", {"amount": 4})
    s1, s2 = command("Audit", {"n": 1}), command("Audit", {"n": 2})
    after = command("Reserve", {"amount": 6})
    await send_first(world, before, s1, s2, after)
    participant = await start(world, register=register)
    await world.bus.wait_replies(4)

    assert levels == [("serializable", ids(s1, s2))]
    assert await world.ledger() == [
        (before.command_id, 4),
        (s1.command_id, 1),
        (s2.command_id, 2),
        (after.command_id, 6),
    ]
    assert participant.stats["processed"] == 4


# --------------------------------------------------------------------------- a death


async def test_a_death_inside_a_batch_handlers_transaction_applies_nothing(
    world: World,
) -> None:
    def die_in_batch_handler(point: str) -> None:
        if point == "in_batch_handler":
            raise SimulatedCrash(point)

    applies = [command("Apply", {"amount": i}) for i in range(1, 4)]
    doomed, calls = await run(world, *applies, crash_hook=die_in_batch_handler)
    with pytest.raises(SimulatedCrash):
        await doomed.run()
    assert calls == [("Apply", ids(*applies))]
    assert await world.ledger() == []
    assert world.bus.replies == []
    world.running.clear()

    successor = await start(world, register=batch_handlers(world, calls))
    replies = by_id(await world.bus.wait_replies(3))

    assert calls == [("Apply", ids(*applies))] * 2
    assert sorted(await world.ledger()) == sorted((a.command_id, a.body["amount"]) for a in applies)
    assert all(body_of(r).outcome == "success" for r in replies.values())
    assert successor.stats["processed"] == 3

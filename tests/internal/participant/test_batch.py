"""The participant's one path on the real Postgres and Kafka: several commands taken in
ONE consumed batch (saga_engine/participant/_record_batch.py), and what each of them must still
get, as it would alone (a batch of one).

Every test sends all of its commands to partition 0 of the command topic BEFORE the
participant starts, so that its first fetch takes them together; the ``batches`` fixture
records what each ``RecordBatchRunner.run`` was given, and each test asserts that its commands
were in fact one batch (if a fetch ever split them, the test fails saying so instead of
passing without testing anything).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka import TopicPartition
from pydantic import BaseModel, field_validator

from saga_engine.core.history._codec import AesGcmCodec, CodecChain, ZstdCodec
from saga_engine.participant import Participant, Transaction
from saga_engine.participant._record_batch import RecordBatchRunner
from saga_engine.transport._wire import ReplyBody
from tests.participant import test_participant
from tests.participant.helpers import (
    OUTSIDE,
    by_id,
    command,
    compensation_of,
    resent,
    send_first,
    start,
)
from tests.participant.test_participant import World, _stat, body_of
from tests.waiting import eventually

pytestmark = pytest.mark.integration

# The participant tests' world: a ledger participant over the real Kafka and Postgres.
world = test_participant.world

COMPENSATED = "compensated before it arrived"


class Picky(BaseModel):
    """A command model whose validator has a bug: it raises KeyError, not ValueError, so
    pydantic lets it through instead of turning it into a ValidationError."""

    n: int

    @field_validator("n")
    @classmethod
    def not_thirteen(cls, n: int) -> int:
        if n == 13:
            raise KeyError("unlucky")
        return n


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The command ids of each batch the participant's RecordBatchRunner was given, in order."""
    seen: list[list[str]] = []
    run = RecordBatchRunner.run

    async def spy(
        self: RecordBatchRunner, records: Sequence[tuple[TopicPartition, Any]]
    ) -> dict[TopicPartition, int]:
        seen.append([dict(r.headers)["ce_commandid"].decode() for _, r in records])
        return await run(self, records)

    monkeypatch.setattr(RecordBatchRunner, "run", spy)
    return seen


# --------------------------------------------------------------------------- record order


async def test_a_compensation_does_not_overtake_its_forward_command_whose_handler_raised(
    world: World, batches: list[list[str]]
) -> None:
    """[X refuses, F raises once, C compensates F] in one batch. Before, F's claim was
    removed and F retried after the batch had committed C: F's effect landed AFTER its
    compensation's, and stayed."""
    refused = command("Reserve", {"amount": 500}, step="reserve")
    forward = command("Flaky", {"fail_times": 1}, step="pay")
    undo = compensation_of(forward, "Reserve", {"amount": 5}, f"{forward.saga_id}:undo-pay")
    await send_first(world, refused, forward, undo)

    participant = await start(world)
    replies = by_id(await world.bus.wait_replies(3))

    assert batches[0] == [refused.command_id, forward.command_id, undo.command_id]
    # The forward effect first, then the compensation's, each once; the refusal's insert
    # rolled back.
    assert await world.ledger() == [(forward.command_id, 0), (undo.command_id, 5)]
    assert body_of(replies[forward.command_id]).outcome == "success"
    assert body_of(replies[forward.command_id]).payload == {"attempt": 2}
    assert body_of(replies[undo.command_id]).outcome == "success"
    refusal = body_of(replies[refused.command_id])
    assert (refusal.outcome, refusal.error) == ("failure", "insufficient credit")
    # One saga: its replies share an inbox partition, so their order is the answer order.
    saga_order = [r.command_id for r in world.bus.replies if r.saga_id == forward.saga_id]
    assert saga_order == [forward.command_id, undo.command_id]
    assert world.effects.calls == {refused.command_id: 1, forward.command_id: 2, undo.command_id: 1}
    assert participant.stats["handler_errors"] == 1
    for cmd, outcome in [(refused, "failure"), (forward, "success"), (undo, "success")]:
        stored = await world.processed(cmd.command_id)
        assert stored is not None
        assert stored["outcome"] == outcome


async def test_a_compensation_that_raises_still_tombstones_its_forward_command(
    world: World, batches: list[list[str]]
) -> None:
    """[C raises once and compensates F, F, B with an invalid body] in one batch: F finds
    C's tombstone, whichever way the batch is split around C; B is dead-lettered once."""
    forward = command("Reserve", {"amount": 5}, step="pay")
    undo = compensation_of(forward, "Flaky", {"fail_times": 1}, f"{forward.saga_id}:undo-pay")
    invalid = command("Reserve", {"amount": "lots"})
    await send_first(world, undo, forward, invalid)

    participant = await start(world)
    replies = by_id(await world.bus.wait_replies(3))
    dead = await world.bus.wait_dead_letters(1)

    assert batches[0] == [undo.command_id, forward.command_id, invalid.command_id]
    assert body_of(replies[undo.command_id]).outcome == "success"
    late = body_of(replies[forward.command_id])
    assert (late.outcome, late.error) == ("failure", COMPENSATED)
    assert world.effects.calls[forward.command_id] == 0
    assert await world.ledger() == [(undo.command_id, 0)]
    rejected = body_of(replies[invalid.command_id])
    assert rejected.outcome == "failure"
    assert rejected.error == "invalid Reserve body: 1 validation error(s)"
    assert [dict(d.headers)["dlq_reason"].decode() for d in dead] == ["invalid_body"]
    # Every dead letter the participant sent is counted: exactly one, for B.
    assert participant.stats["dead_lettered"] == 1
    assert participant.stats["dead_lettered_invalid_body"] == 1
    assert participant.stats["handler_errors"] == 1


# --------------------------------------------------------------------------- isolation


class Audit(BaseModel):
    fail_times: int


async def test_a_handler_at_another_isolation_level_runs_alone_at_it_on_every_attempt(
    world: World, batches: list[list[str]]
) -> None:
    """[R, A raises once, R'] where A's handler asks for SERIALIZABLE: A runs alone, at
    its level on its retry too, and between R and R' (record order)."""
    levels: list[tuple[str, int]] = []

    def register(participant: Participant) -> None:
        @participant.handles(Audit, isolation="serializable", effects=OUTSIDE)
        async def audit(cmd: Audit, tx: Transaction) -> dict[str, int]:
            world.effects.calls[tx.command_id] += 1
            levels.append((await tx.fetchval("SHOW transaction_isolation"), tx.attempt))
            await tx.execute(
                "INSERT INTO ledger (command_id, amount) VALUES ($1, 1)", tx.command_id
            )
            if world.effects.calls[tx.command_id] <= cmd.fail_times:
                raise RuntimeError("audit failed")
            return {"attempt": tx.attempt}

    before = command("Reserve", {"amount": 4})
    audited = command("Audit", {"fail_times": 1})
    after = command("Reserve", {"amount": 6})
    await send_first(world, before, audited, after)

    participant = await start(world, register=register)
    replies = by_id(await world.bus.wait_replies(3))

    assert batches[0] == [before.command_id, audited.command_id, after.command_id]
    assert levels == [("serializable", 1), ("serializable", 2)]
    assert body_of(replies[audited.command_id]).payload == {"attempt": 2}
    # The ledger in insertion order: record order held.
    assert await world.ledger() == [
        (before.command_id, 4),
        (audited.command_id, 1),
        (after.command_id, 6),
    ]
    assert participant.stats["handler_errors"] == 1
    assert participant.stats["processed"] == 3


# --------------------------------------------------------------------------- failures


async def test_a_model_validator_that_raises_a_bug_dead_letters_that_command_only(
    world: World, batches: list[list[str]]
) -> None:
    """Before, the KeyError escaped the batch and the participant stopped consuming."""

    def register(participant: Participant) -> None:
        @participant.handles(Picky)
        async def picky(cmd: Picky, tx: Transaction) -> dict[str, int]:
            world.effects.calls[tx.command_id] += 1
            return {"n": cmd.n}

    good = command("Reserve", {"amount": 7})
    bad = command("Picky", {"n": 13})
    await send_first(world, good, bad)

    participant = await start(world, register=register)
    [reply] = await world.bus.wait_replies(1)
    dead = await world.bus.wait_dead_letters(1)

    assert batches[0] == [good.command_id, bad.command_id]
    assert reply.command_id == good.command_id
    assert body_of(reply).outcome == "success"
    assert dict(dead[0].headers)["dlq_reason"].decode() == "engine_error"
    assert dict(dead[0].headers)["ce_commandid"].decode() == bad.command_id
    assert "KeyError" in dict(dead[0].headers)["dlq_detail"].decode()

    # Still consuming: a later command is answered.
    later = command("Reserve", {"amount": 9})
    await world.bus.send(later, partition=0)
    replies = await world.bus.wait_replies(2)

    assert [r.command_id for r in replies] == [good.command_id, later.command_id]
    assert body_of(replies[1]).outcome == "success"
    assert await world.ledger() == [(good.command_id, 7), (later.command_id, 9)]
    assert world.effects.calls[bad.command_id] == 0
    assert participant.stats["dead_lettered"] == 1
    assert participant.stats["dead_lettered_engine_error"] == 1


async def test_with_one_handler_attempt_a_handler_that_raises_runs_once(
    world: World, batches: list[list[str]]
) -> None:
    """handler_attempts=1: before, the batch counted the failed attempt, then the single
    path ran the handler again as "attempt 1" (and here it would have succeeded)."""
    settings = world.settings.model_copy(
        update={
            "participant": world.settings.participant.model_copy(update={"handler_attempts": 1})
        }
    )
    good = command("Reserve", {"amount": 10})
    flaky = command("Flaky", {"fail_times": 1})
    await send_first(world, good, flaky)

    participant = await start(world, settings=settings)
    replies = by_id(await world.bus.wait_replies(2))

    assert batches[0] == [good.command_id, flaky.command_id]
    assert world.effects.calls[flaky.command_id] == 1
    answer = body_of(replies[flaky.command_id])
    assert (answer.outcome, answer.error) == ("retryable", "RuntimeError: flaky failure 1")
    assert body_of(replies[good.command_id]).outcome == "success"
    assert await world.ledger() == [(good.command_id, 10)]
    stored = await world.processed(flaky.command_id)
    assert stored is not None
    assert stored["outcome"] == "retryable"
    assert participant.stats["handler_errors"] == 1
    assert participant.stats["retryable"] == 1


async def test_a_refusal_in_a_batch_leaves_its_neighbours_applied_once(
    world: World, batches: list[list[str]]
) -> None:
    """The refusal rolls the first pass back; the second pass (with savepoints) records
    it without running the refusing handler again, and applies the others once."""
    first = command("Reserve", {"amount": 10})
    refused = command("Reserve", {"amount": 500})
    last = command("Reserve", {"amount": 20})
    await send_first(world, first, refused, last)

    participant = await start(world)
    replies = by_id(await world.bus.wait_replies(3))

    assert batches[0] == [first.command_id, refused.command_id, last.command_id]
    assert await world.ledger() == [(first.command_id, 10), (last.command_id, 20)]
    assert world.effects.calls[refused.command_id] == 1
    refusal = body_of(replies[refused.command_id])
    assert refusal.outcome == "failure"
    assert refusal.error == "insufficient credit"
    assert refusal.payload == {"requested": 500, "limit": 100}
    stored = await world.processed(refused.command_id)
    assert stored is not None
    assert (stored["outcome"], stored["error"]) == ("failure", "insufficient credit")
    for cmd, amount in [(first, 10), (last, 20)]:
        assert body_of(replies[cmd.command_id]).payload == {
            "reservation": f"r-{cmd.command_id}",
            "amount": amount,
        }
    assert participant.stats["rejected"] == 1
    assert participant.stats["processed"] == 3
    assert participant.stats["batch_replays"] == 1


async def test_a_retryable_answer_in_a_batch_leaves_its_neighbours_applied_once(
    world: World, batches: list[list[str]]
) -> None:
    """As a refusal: the first pass rolls back, the second records the Retryable without
    running its handler again; the engine gets a ``retryable`` at once."""
    first = command("Reserve", {"amount": 5})
    busy = command("Busy", {})
    last = command("Reserve", {"amount": 7})
    await send_first(world, first, busy, last)

    participant = await start(world)
    replies = by_id(await world.bus.wait_replies(3))

    assert batches[0] == [first.command_id, busy.command_id, last.command_id]
    assert body_of(replies[busy.command_id]) == ReplyBody(outcome="retryable", error="busy")
    assert world.effects.calls[busy.command_id] == 1
    assert await world.ledger() == [(first.command_id, 5), (last.command_id, 7)]
    for cmd in (first, last):
        assert body_of(replies[cmd.command_id]).outcome == "success"
    stored = await world.processed(busy.command_id)
    assert stored is not None
    assert (stored["outcome"], stored["error"]) == ("retryable", "busy")
    assert participant.stats["retryable"] == 1
    assert participant.stats["handler_errors"] == 0
    assert participant.stats["processed"] == 3
    assert participant.stats["batch_replays"] == 1


async def test_a_batch_that_fails_for_no_commands_fault_answers_the_others_one_at_a_time(
    world: World, batches: list[list[str]]
) -> None:
    """A duplicate whose stored reply this participant cannot open (sealed by one that had
    the codec's key) fails the whole batch's transaction, and no handler is to blame:
    the batch is taken one command at a time, the duplicate is dead-lettered as
    engine_error, and its neighbours are answered once."""
    # Its sealed reply goes to a topic of its own: the test's inbox reader has no key.
    sealed = command("Reserve", {"amount": 3}).model_copy(
        update={"reply_to": f"{world.settings.kafka.topic_prefix}.sealed"}
    )
    await send_first(world, sealed)
    codec = CodecChain(ZstdCodec(threshold=16), AesGcmCodec({"k1": os.urandom(32)}, "k1"))
    keyed = await start(world, codec=codec)
    await eventually(lambda: _stat(keyed, "processed", 1))
    await keyed.stop()
    world.running.clear()

    first = command("Reserve", {"amount": 10})
    last = command("Reserve", {"amount": 20})
    await send_first(world, first, resent(sealed), last)
    participant = await start(world)
    replies = by_id(await world.bus.wait_replies(2))
    [dead] = await world.bus.wait_dead_letters(1)

    assert batches[-1] == [first.command_id, sealed.command_id, last.command_id]
    assert sorted(replies) == sorted([first.command_id, last.command_id])
    for cmd in (first, last):
        assert body_of(replies[cmd.command_id]).outcome == "success"
    assert dict(dead.headers)["dlq_reason"] == b"engine_error"
    assert dict(dead.headers)["ce_commandid"].decode() == sealed.command_id
    assert b"CodecError" in dict(dead.headers)["dlq_detail"]
    assert await world.ledger() == [
        (sealed.command_id, 3),
        (first.command_id, 10),
        (last.command_id, 20),
    ]
    # The stored replies are opened before any handler runs: the pass failed before
    # ``first``'s handler ran, so each handler ran once.
    assert world.effects.calls == {sealed.command_id: 1, first.command_id: 1, last.command_id: 1}
    assert participant.stats["batch_fallbacks"] == 1
    assert participant.stats["processed"] == 2
    assert participant.stats["dead_lettered_engine_error"] == 1

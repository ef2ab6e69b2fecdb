"""The participant kit on the real Postgres and Kafka: applied once, replied always.

Each test drives a ``ledger`` participant the way an engine would: COMMAND envelopes go
to its command topic, REPLY envelopes are read from the inbox, and a ledger table in
the participant's own schema counts the handlers' effects.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel, SecretStr

from saga_engine.participant import CommandBatch, Participant, Retryable, Transaction
from saga_engine.protocol import Envelope, MessageType, ReplyBody, encode
from saga_engine.settings import KafkaSettings, ParticipantSettings, Settings
from tests.conftest import PgTarget
from tests.integration.kafka_helpers import ensure_topics
from tests.participant.helpers import (
    OUTSIDE,
    PARTICIPANT,
    TRACEPARENT,
    Bus,
    Effects,
    command,
    create_ledger,
    delete_topics,
    ledger_participant,
    query,
    resent,
    start,
)
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class SimulatedCrash(Exception):
    """Raised by a crash hook: the participant process "dies" at that point."""


@dataclass
class World:
    settings: Settings
    pg: PgTarget
    bus: Bus
    effects: Effects = field(default_factory=Effects)
    running: list[Participant] = field(default_factory=list)

    async def participant(self, **options: Any) -> Participant:
        """A started ledger participant (stopped at the end of the test)."""
        options.setdefault("backoff_base_s", 0.01)
        participant = ledger_participant(self.settings, self.effects, **options)
        self.running.append(participant)
        await participant.start()
        return participant

    async def ledger(self) -> list[tuple[str, int]]:
        rows = await query(self.pg.dsn, "SELECT command_id, amount FROM ledger ORDER BY id")
        return [(r["command_id"], r["amount"]) for r in rows]

    async def processed(self, command_id: str) -> asyncpg.Record | None:
        rows = await query(
            self.pg.dsn,
            "SELECT outcome, reply::text AS reply, error FROM saga_processed_commands "
            "WHERE command_id = $1",
            command_id,
        )
        return rows[0] if rows else None

    async def all_published(self) -> bool:
        return await self.unpublished() == 0

    async def unpublished(self) -> int:
        rows = await query(
            self.pg.dsn, "SELECT count(*) AS n FROM saga_reply_outbox WHERE published_at IS NULL"
        )
        return int(rows[0]["n"])


@pytest.fixture
async def world(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> AsyncIterator[World]:
    prefix = f"t{unique_id}"
    settings = Settings(
        kafka=KafkaSettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=prefix,
            partitions=2,
            max_message_bytes=8192,
        ),
        participant=ParticipantSettings(
            dsn=SecretStr(pg.database_dsn), db_schema=pg.schema, handler_attempts=3
        ),
    )
    await create_ledger(pg.dsn)
    bus = Bus(settings.kafka)
    await ensure_topics(
        settings.kafka, [bus.command_topic, bus.topics.inbox, bus.topics.dlq], partitions=2
    )
    await bus.start()
    w = World(settings, pg, bus)
    try:
        yield w
    finally:
        for participant in w.running:
            await participant.stop()
        await bus.stop()
        await delete_topics(kafka_bootstrap, prefix)


def body_of(reply: Envelope) -> ReplyBody:
    return ReplyBody.model_validate(reply.body)


# --------------------------------------------------------------------------- applied once


async def test_a_command_is_applied_once_and_replied_success(world: World) -> None:
    participant = await world.participant()
    cmd = command("Reserve", {"amount": 30})

    await world.bus.send(cmd)
    [reply] = await world.bus.wait_replies(1)

    assert reply.message_type is MessageType.REPLY
    assert body_of(reply) == ReplyBody(
        outcome="success", payload={"reservation": f"r-{cmd.command_id}", "amount": 30}
    )
    headers = world.bus.reply_headers[0]
    assert headers["ce_type"] == "saga.reply"
    assert headers["ce_commandid"] == cmd.command_id
    assert headers["ce_causationid"] == cmd.id
    assert headers["ce_correlationid"] == cmd.saga_id
    assert headers["ce_sagaid"] == cmd.saga_id
    assert headers["ce_step"] == cmd.step
    assert headers["ce_source"] == f"/participants/{PARTICIPANT}"
    assert headers["traceparent"] == TRACEPARENT
    assert await world.ledger() == [(cmd.command_id, 30)]
    stored = await world.processed(cmd.command_id)
    assert stored is not None
    assert stored["outcome"] == "success"
    assert ReplyBody.model_validate_json(stored["reply"]) == body_of(reply)
    assert await eventually(world.all_published)
    assert participant.stats["processed"] == 1

    # The offset was committed after the transaction: a new instance does not see the
    # command again (no duplicate), and carries on with the next one.
    await participant.stop()
    successor = await world.participant()
    nxt = command("Reserve", {"amount": 5})
    await world.bus.send(nxt)
    await world.bus.wait_replies(2)
    assert successor.stats["processed"] == 1
    assert successor.stats["duplicates"] == 0
    assert [c for c, _ in await world.ledger()] == [cmd.command_id, nxt.command_id]


async def test_a_command_sent_three_times_is_applied_once(world: World) -> None:
    participant = await world.participant()
    cmd = command("Reserve", {"amount": 30})
    sends = [cmd, resent(cmd), resent(cmd)]

    for envelope in sends:
        await world.bus.send(envelope)
    replies = await world.bus.wait_replies(3)

    assert world.effects.calls[cmd.command_id] == 1
    assert await world.ledger() == [(cmd.command_id, 30)]
    assert len(replies) == 3
    assert len({r.body["payload"]["reservation"] for r in replies}) == 1
    assert all(body_of(r) == body_of(replies[0]) for r in replies)
    assert body_of(replies[0]).outcome == "success"
    # Each reply answers the message it was sent for.
    assert [r.causation_id for r in replies] == [s.id for s in sends]
    assert participant.stats["processed"] == 1
    assert participant.stats["duplicates"] == 2


# --------------------------------------------------------------------------- refusals


async def test_a_rejection_rolls_back_and_a_duplicate_gets_the_same_refusal(
    world: World,
) -> None:
    participant = await world.participant()
    cmd = command("Reserve", {"amount": 500})

    await world.bus.send(cmd)
    [reply] = await world.bus.wait_replies(1)

    assert body_of(reply) == ReplyBody(
        outcome="failure",
        payload={"requested": 500, "limit": 100},
        error="insufficient credit",
    )
    # The handler inserted into the ledger before refusing: the savepoint undid it.
    assert await world.ledger() == []
    stored = await world.processed(cmd.command_id)
    assert stored is not None
    assert (stored["outcome"], stored["error"]) == ("failure", "insufficient credit")

    await world.bus.send(resent(cmd))
    replies = await world.bus.wait_replies(2)

    assert body_of(replies[1]) == body_of(reply)
    assert world.effects.calls[cmd.command_id] == 1
    assert await world.ledger() == []
    assert participant.stats["rejected"] == 1
    assert participant.stats["duplicates"] == 1


async def test_unknown_command_type_gets_a_failure_reply(world: World) -> None:
    participant = await world.participant()
    cmd = command("Teleport", {"to": "mars"})

    await world.bus.send(cmd)
    [reply] = await world.bus.wait_replies(1)

    body = body_of(reply)
    assert body.outcome == "failure"
    assert body.error == f"participant {PARTICIPANT} cannot handle Teleport"
    assert body.payload == {
        "command_type": "Teleport",
        "handles": ["Busy", "BusyAlone", "Flaky", "Reserve"],
    }
    assert participant.stats["unknown_command"] == 1
    stored = await world.processed(cmd.command_id)
    assert stored is not None
    assert stored["outcome"] == "failure"


class Bulky(BaseModel):
    size: int


@pytest.mark.parametrize("batch", [False, True], ids=["handler", "batch_handler"])
async def test_a_reply_over_the_size_limit_is_refused_once_not_retried(
    world: World, batch: bool
) -> None:
    """PROTOCOL.md 7.3: a refusal the same handler would give every time is a ``failure``
    (nothing applied), answered once: not a crash re-run ``handler_attempts`` times and
    then answered ``retryable`` for the engine to send again (issue 39, 8.2)."""

    def register(participant: Participant) -> None:
        async def write(tx: Transaction) -> None:
            world.effects.calls[tx.command_id] += 1
            await tx.execute(
                "INSERT INTO ledger (command_id, amount) VALUES ($1, 7)", tx.command_id
            )

        if batch:

            @participant.handles_batch(Bulky, effects=OUTSIDE)
            async def bulky_batch(commands: CommandBatch[Bulky]) -> list[dict[str, str]]:
                out = []
                for one in commands:
                    world.effects.calls[one.command_id] += 1
                    await commands.execute(
                        "INSERT INTO ledger (command_id, amount) VALUES ($1, 7)", one.command_id
                    )
                    out.append({"blob": "x" * one.command.size})
                return out

        else:

            @participant.handles(Bulky, effects=OUTSIDE)
            async def bulky(cmd: Bulky, tx: Transaction) -> dict[str, str]:
                await write(tx)
                return {"blob": "x" * cmd.size}

    participant = await start(world, register=register)
    cmd = command("Bulky", {"size": 20_000})  # the world's limit is 8192 bytes

    await world.bus.send(cmd)
    [reply] = await world.bus.wait_replies(1)

    body = body_of(reply)
    assert body.outcome == "failure"
    assert body.error is not None
    assert "over the limit of 8192 bytes (SAGA_KAFKA__MAX_MESSAGE_BYTES)" in body.error
    assert body.payload["limit_bytes"] == 8192
    assert body.payload["size_bytes"] > 20_000
    # Once, though handler_attempts is 3: the same result would be refused every time.
    assert world.effects.calls[cmd.command_id] == 1
    assert participant.stats["handler_errors"] == 0
    assert participant.stats["reply_too_large"] == 1
    assert await world.ledger() == []  # its write rolled back: a failure applies nothing
    stored = await world.processed(cmd.command_id)
    assert stored is not None
    assert stored["outcome"] == "failure"

    # Stored like any answer: a copy gets it again without the handler.
    await world.bus.send(resent(cmd))
    replies = await world.bus.wait_replies(2)
    assert body_of(replies[1]) == body
    assert world.effects.calls[cmd.command_id] == 1


async def test_a_participant_started_while_postgres_recovers_waits_for_it(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39, 8.6: Postgres restarting answers "the database system is not yet
    accepting connections" (57P03) for a few seconds, or refuses connections outright;
    a participant started meanwhile waits (the engine's start-up patience), not exit 1.
    The connect is faked for its first three calls; the real server answers the rest."""
    real = asyncpg.connect
    failures: list[BaseException] = [
        asyncpg.exceptions.CannotConnectNowError(
            "the database system is not yet accepting connections"
        ),
        asyncpg.exceptions.CannotConnectNowError(
            "the database system is not yet accepting connections"
        ),
        ConnectionRefusedError(111, "Connect call failed"),
    ]
    calls = 0

    async def connect(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if failures:
            raise failures.pop(0)
        return await real(*args, **kwargs)

    monkeypatch.setattr(asyncpg, "connect", connect)
    participant = await world.participant()

    assert calls == 4, "three failed connects waited out, then the migration's own"
    cmd = command("Reserve", {"amount": 5})
    await world.bus.send(cmd)
    [reply] = await world.bus.wait_replies(1)
    assert body_of(reply).outcome == "success"
    assert participant.stats["processed"] == 1


# --------------------------------------------------------------------------- crashes in handlers


async def test_a_handler_that_fails_twice_then_succeeds_is_applied_once(world: World) -> None:
    participant = await world.participant()
    cmd = command("Flaky", {"fail_times": 2})

    await world.bus.send(cmd)
    [reply] = await world.bus.wait_replies(1)

    assert body_of(reply) == ReplyBody(outcome="success", payload={"attempt": 3})
    assert world.effects.calls[cmd.command_id] == 3
    # Each failed attempt's insert was rolled back with its transaction.
    assert await world.ledger() == [(cmd.command_id, 0)]
    assert participant.stats["handler_errors"] == 2
    assert participant.stats["processed"] == 1


async def test_a_handler_that_always_fails_replies_retryable_and_applies_nothing(
    world: World,
) -> None:
    participant = await world.participant()
    cmd = command("Flaky", {"fail_times": 1000})

    await world.bus.send(cmd)
    [reply] = await world.bus.wait_replies(1)

    body = body_of(reply)
    assert body.outcome == "retryable"
    assert body.error == "RuntimeError: flaky failure 3"
    assert world.effects.calls[cmd.command_id] == 3  # settings.participant.handler_attempts
    assert await world.ledger() == []
    assert participant.stats["retryable"] == 1
    assert participant.stats["handler_errors"] == 3

    # The engine retries under a new command id and ignores late replies to this one, so
    # a copy of it must get the same answer and apply nothing, even though the handler
    # would now succeed (PROTOCOL.md 7.3: a retryable command id is dead for good).
    stored = await world.processed(cmd.command_id)
    assert stored is not None
    assert stored["outcome"] == "retryable"
    await world.bus.send(resent(cmd))
    replies = await world.bus.wait_replies(2)
    assert body_of(replies[1]) == body
    assert world.effects.calls[cmd.command_id] == 3
    assert participant.stats["duplicates"] == 1

    # The retry, under its new id, runs the handler again from scratch.
    retry = command("Flaky", {"fail_times": 0}, saga_id=cmd.saga_id, command_id=f"{cmd.saga_id}:1")
    await world.bus.send(retry)
    replies = await world.bus.wait_replies(3)
    assert body_of(replies[2]) == ReplyBody(outcome="success", payload={"attempt": 1})
    assert await world.ledger() == [(retry.command_id, 0)]


# A handler at the batch's isolation level, and one at another (a transaction of its own).
@pytest.mark.parametrize("subject", ["Busy", "BusyAlone"])
async def test_a_retryable_answer_is_sent_at_once_and_stored_without_handler_retries(
    world: World, subject: str
) -> None:
    participant = await world.participant()
    cmd = command(subject, {"after_s": 2.5})

    await world.bus.send(cmd)
    [reply] = await world.bus.wait_replies(1)

    assert body_of(reply) == ReplyBody(
        outcome="retryable", payload={"retry_after_s": 2.5}, error="busy (retry after 2.5s)"
    )
    # Once, though handler_attempts is 3: a Retryable is an answer, not a crash.
    assert world.effects.calls[cmd.command_id] == 1
    assert await world.ledger() == []  # its write rolled back
    assert participant.stats["retryable"] == 1
    assert participant.stats["handler_errors"] == 0
    stored = await world.processed(cmd.command_id)
    assert stored is not None
    assert (stored["outcome"], stored["error"]) == ("retryable", "busy (retry after 2.5s)")

    # Stored like any answer: a copy of the command gets it again, without the handler.
    await world.bus.send(resent(cmd))
    replies = await world.bus.wait_replies(2)
    assert body_of(replies[1]) == body_of(reply)
    assert world.effects.calls[cmd.command_id] == 1
    assert participant.stats["duplicates"] == 1


def test_retryable_refuses_a_negative_or_endless_delay() -> None:
    assert Retryable("x", after=timedelta(seconds=3)).after == timedelta(seconds=3)
    assert Retryable("x", after=0.5).after == timedelta(seconds=0.5)
    assert Retryable("x").after is None
    for bad in (-1.0, float("inf"), float("nan"), timedelta(seconds=-1)):
        with pytest.raises(ValueError, match="finite delay"):
            Retryable("x", after=bad)


# --------------------------------------------------------------------------- bad input


async def test_poison_records_are_dead_lettered_and_the_partition_keeps_flowing(
    world: World,
) -> None:
    participant = await world.participant()
    saga = "saga-poison"  # one key: every record below lands in the same partition
    base = command("Reserve", {"amount": 1}, saga_id=saga, command_id=f"{saga}:0")
    key, value, headers = encode(base)

    def without(name: str) -> list[tuple[str, bytes]]:
        return [(k, v) for k, v in headers if k != name]

    await world.bus.send_raw(key, b'{"amount": 1', headers)
    await world.bus.send_raw(key, value, [*without("ce_schemaversion"), ("ce_schemaversion", b"2")])
    await world.bus.send_raw(key, value, without("ce_sagaid"))
    await world.bus.send(command("Reserve", {"amount": 1, "pad": "x" * 9000}, saga_id=saga))
    invalid = command("Reserve", {"amount": "lots"}, saga_id=saga, command_id=f"{saga}:1")
    await world.bus.send(invalid)
    valid = command("Reserve", {"amount": 7}, saga_id=saga, command_id=f"{saga}:2")
    await world.bus.send(valid)

    dead = await world.bus.wait_dead_letters(5)
    replies = await world.bus.wait_replies(2)

    reasons = [dict(d.headers)["dlq_reason"].decode() for d in dead]
    assert sorted(reasons) == sorted(
        ["malformed_json", "wrong_schema_version", "missing_header", "oversized", "invalid_body"]
    )
    assert {dict(d.headers)["dlq_topic"].decode() for d in dead} == {world.bus.command_topic}
    # A body that fails validation is also answered, so its saga need not time out.
    assert [r.command_id for r in replies] == [invalid.command_id, valid.command_id]
    refusal = body_of(replies[0])
    assert refusal.outcome == "failure"
    assert refusal.error == "invalid Reserve body: 1 validation error(s)"
    assert refusal.payload["errors"][0]["loc"] == ["amount"]
    assert body_of(replies[1]).outcome == "success"
    assert await world.ledger() == [(valid.command_id, 7)]
    assert participant.stats["dead_lettered"] == 5
    assert participant.stats["processed"] == 2


async def test_a_command_postgres_cannot_store_gets_a_failure_reply_saying_where(
    world: World,
) -> None:
    """Before, the handler's transaction failed in Postgres, the record was dead-lettered
    as engine_error with a traceback, and the step waited for its timeout."""
    participant = await world.participant()
    saga = "saga-nul"  # one key: one partition, in order
    nul = command(
        "Reserve",
        {"amount": 3, "memo": "a\u0000b", "tags": ["ok", "\ud800"]},
        saga_id=saga,
        command_id=f"{saga}:0",
    )
    step_nul = command("Reserve", {"amount": 4}, saga_id=saga, command_id=f"{saga}:1")
    step_nul = step_nul.model_copy(update={"step": "reserve\u0000"})
    valid = command("Reserve", {"amount": 7}, saga_id=saga, command_id=f"{saga}:2")
    # As a producer in another language may write it: an escaped lone surrogate is JSON,
    # but not Unicode (orjson would not even write it).
    key, _, headers = encode(nul.model_copy(update={"body": {}}))
    await world.bus.send_raw(key, json.dumps(nul.body).encode(), headers)
    for envelope in (step_nul, valid):
        await world.bus.send(envelope)

    replies = await world.bus.wait_replies(2)
    dead = await world.bus.wait_dead_letters(2)

    assert [r.command_id for r in replies] == [nul.command_id, valid.command_id]
    refusal = body_of(replies[0])
    assert refusal.outcome == "failure"
    assert refusal.error is not None
    assert refusal.error.startswith("Reserve body: memo: contains a NUL character (\\u0000)")
    assert [e["loc"] for e in refusal.payload["errors"]] == [["memo"], ["tags", 1]]
    assert body_of(replies[1]).outcome == "success"
    reasons = [dict(d.headers)["dlq_reason"].decode() for d in dead]
    assert reasons == ["unstorable_value", "unstorable_value"]
    assert "ce_step: contains a NUL" in dict(dead[1].headers)["dlq_detail"].decode()
    # Recorded as answered (a re-send gets the same refusal), and nothing was applied.
    stored = await world.processed(nul.command_id)
    assert stored is not None
    assert stored["outcome"] == "failure"
    assert await world.ledger() == [(valid.command_id, 7)]
    assert participant.stats["unstorable"] == 1
    assert participant.stats["dead_lettered_engine_error"] == 0


async def test_a_command_nested_too_deep_gets_a_failure_reply_saying_so(world: World) -> None:
    """Before, a body past the JSON parser's 1,024 levels raised RecursionError: the
    record was dead-lettered as engine_error, unanswered, and the step waited for its
    timeout. Now it is refused like a body nested 255 levels deep."""
    participant = await world.participant()
    saga = "saga-deep"  # one key: one partition, in order
    unreadable = command("Reserve", {}, saga_id=saga, command_id=f"{saga}:0")
    readable = command("Reserve", {}, saga_id=saga, command_id=f"{saga}:1")
    valid = command("Reserve", {"amount": 7}, saga_id=saga, command_id=f"{saga}:2")
    for envelope, levels in ((unreadable, 3000), (readable, 300)):
        key, _, headers = encode(envelope)
        deep = b'{"amount": 1, "memo": ' + b"[" * levels + b"]" * levels + b"}"
        await world.bus.send_raw(key, deep, headers)
    await world.bus.send(valid)

    replies = await world.bus.wait_replies(3)
    dead = await world.bus.wait_dead_letters(2)

    assert [r.command_id for r in replies] == [c.command_id for c in (unreadable, readable, valid)]
    for reply in replies[:2]:
        refusal = body_of(reply)
        assert refusal.outcome == "failure"
        assert refusal.error is not None
        assert refusal.error.startswith("Reserve body: "), refusal.error
        assert refusal.error.endswith("is nested more than 254 levels deep"), refusal.error
    assert body_of(replies[2]).outcome == "success"
    assert [dict(d.headers)["dlq_reason"].decode() for d in dead] == ["unstorable_value"] * 2
    stored = await world.processed(unreadable.command_id)  # a re-send gets the same refusal
    assert stored is not None
    assert stored["outcome"] == "failure"
    assert await world.ledger() == [(valid.command_id, 7)]
    assert participant.stats["unstorable"] == 2
    assert participant.stats["dead_lettered_engine_error"] == 0


# --------------------------------------------------------------------------- the outbox


async def test_a_reply_left_by_a_crash_after_commit_is_sent_when_the_command_comes_again(
    world: World,
) -> None:
    def die_after_commit(point: str) -> None:
        if point == "after_commit":
            raise SimulatedCrash(point)

    doomed = await world.participant(crash_hook=die_after_commit)
    cmd = command("Reserve", {"amount": 30})

    await world.bus.send(cmd)
    with pytest.raises(SimulatedCrash):
        await asyncio.wait_for(doomed.run(), timeout=20)

    # It died after COMMIT and before publishing: the effect and the reply are durable,
    # nothing reached the inbox, and no outbox row was needed: the offset was not
    # committed, so the uncommitted command itself is the reply still owed.
    assert await world.ledger() == [(cmd.command_id, 30)]
    assert await world.unpublished() == 0
    assert world.bus.replies == []

    successor = await world.participant()
    replies = await world.bus.wait_replies(1)

    # The command comes again: it is a duplicate, and gets the stored reply without the
    # handler running again.
    await eventually(lambda: _stat(successor, "duplicates", 1))
    assert body_of(replies[0]) == ReplyBody(
        outcome="success", payload={"reservation": f"r-{cmd.command_id}", "amount": 30}
    )
    assert replies[0].causation_id == cmd.id
    assert world.effects.calls[cmd.command_id] == 1
    assert await world.ledger() == [(cmd.command_id, 30)]
    assert successor.stats["outbox_relayed"] == 0


async def _stat(participant: Participant, name: str, value: int) -> bool:
    return participant.stats[name] >= value


# --------------------------------------------------------------------------- scale-out


async def test_two_instances_share_partitions_without_duplicate_effects(world: World) -> None:
    first = await world.participant()
    second = await world.participant()

    async def split() -> bool:
        return first.assignment | second.assignment == {0, 1} and not (
            first.assignment & second.assignment
        )

    await eventually(split)

    commands = [command("Reserve", {"amount": i, "delay_s": 0.05}) for i in range(1, 13)]
    sent = 0
    for cmd in commands:
        await world.bus.send(cmd)
        await world.bus.send(resent(cmd))
        sent += 2
    # The same command on both partitions at once: both instances claim it concurrently,
    # and the unique index makes one wait for the other's transaction.
    for cmd in commands[:4]:
        for partition in (0, 1):
            await world.bus.send(resent(cmd), partition=partition)
            sent += 1

    replies = await world.bus.wait_replies(sent, timeout=40)

    ledger = await world.ledger()
    assert sorted(c for c, _ in ledger) == sorted(c.command_id for c in commands)
    assert all(world.effects.calls[c.command_id] == 1 for c in commands)
    by_command: dict[str, list[Envelope]] = {}
    for reply in replies:
        by_command.setdefault(reply.command_id, []).append(reply)
    for cmd in commands:
        bodies = [body_of(r) for r in by_command[cmd.command_id]]
        assert bodies == [bodies[0]] * len(bodies)
        assert bodies[0].outcome == "success"
    assert first.stats["processed"] > 0
    assert second.stats["processed"] > 0
    assert first.stats["processed"] + second.stats["processed"] == len(commands)
    assert first.stats["duplicates"] + second.stats["duplicates"] == sent - len(commands)


class Gated(BaseModel):
    pass


async def _apply_seven(world: World, tx: Transaction) -> None:
    world.effects.calls[tx.command_id] += 1
    await tx.execute("INSERT INTO ledger (command_id, amount) VALUES ($1, 7)", tx.command_id)


async def test_a_copy_claimed_on_another_instance_meanwhile_waits_and_never_runs_its_handler(
    world: World,
) -> None:
    """The same command on two instances at once: the second waits on the first one's
    claim until it commits, then answers with its stored reply; its handler never runs,
    not even in a transaction that is rolled back."""
    gate = asyncio.Event()

    def gated(participant: Participant) -> None:
        # Its calls are counted in memory: an effect outside its transaction, which
        # keeps it on the locked claim (the optimistic one: tests/internal/participant/test_optimistic_claim.py).
        @participant.handles(Gated, effects=OUTSIDE)
        async def handle(cmd: Gated, tx: Transaction) -> dict[str, str]:
            await _apply_seven(world, tx)
            await gate.wait()
            return {"by": "the first"}

    first = await start(world, register=gated)
    second = await start(world, register=gated)

    async def split() -> bool:
        return first.assignment | second.assignment == {0, 1} and not (
            first.assignment & second.assignment
        )

    await eventually(split)
    cmd = command("Gated", {})
    await world.bus.send(cmd, partition=0)

    async def entered() -> bool:
        return world.effects.calls[cmd.command_id] == 1

    await eventually(entered)
    await world.bus.send(resent(cmd), partition=1)

    async def waiting_on_the_claim() -> bool:
        rows = await query(
            world.pg.dsn,
            "SELECT count(*) AS n FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' "
            "AND query LIKE '%pg_advisory_xact_lock%'",
        )
        return int(rows[0]["n"]) >= 1

    await eventually(waiting_on_the_claim)
    gate.set()
    replies = await world.bus.wait_replies(2)

    assert world.effects.calls[cmd.command_id] == 1
    assert await world.ledger() == [(cmd.command_id, 7)]
    assert [body_of(r).payload for r in replies] == [{"by": "the first"}] * 2
    assert first.stats["processed"] + second.stats["processed"] == 1
    assert first.stats["duplicates"] + second.stats["duplicates"] == 1


async def test_an_outcome_stored_by_another_kit_meanwhile_rolls_the_batch_back_and_wins(
    world: World,
) -> None:
    """A participant of another kit shares the table and claims by inserting first, not
    by this kit's lock: its row, committed while the handler ran, wins. The batch is
    rolled back (the handler's write with it) and answered with that stored reply."""
    foreign = '{"outcome": "success", "payload": {"by": "the other kit"}, "error": null}'

    def racing(participant: Participant) -> None:
        @participant.handles(Gated)
        async def handle(cmd: Gated, tx: Transaction) -> dict[str, str]:
            await _apply_seven(world, tx)
            await query(
                world.pg.dsn,
                "INSERT INTO saga_processed_commands "
                "(command_id, saga_id, command_type, step, outcome, reply) "
                "VALUES ($1, $2, 'Gated', $3, 'success', $4::jsonb)",
                tx.command_id,
                cmd_env.saga_id,
                cmd_env.step,
                foreign,
            )
            return {"by": "this kit"}

    cmd_env = command("Gated", {})
    participant = await start(world, register=racing)
    await world.bus.send(cmd_env)
    [reply] = await world.bus.wait_replies(1)

    assert body_of(reply).payload == {"by": "the other kit"}
    assert world.effects.calls[cmd_env.command_id] == 1
    assert await world.ledger() == []
    assert participant.stats["claims_lost"] == 1
    assert participant.stats["duplicates"] == 1


async def test_a_forward_command_arriving_after_its_compensation_is_never_applied(
    world: World,
) -> None:
    await world.participant()
    forward = command("Reserve", {"amount": 30}, step="reserve")
    compensation = command(
        "Flaky", {"fail_times": 0}, saga_id=forward.saga_id, command_id="undo-1", step="reserve"
    ).model_copy(update={"compensation": True, "compensates": forward.command_id})

    await world.bus.send(compensation)
    await world.bus.wait_replies(1)
    await world.bus.send(forward)  # late: delayed somewhere, after the compensation
    replies = await world.bus.wait_replies(2)

    late = next(r for r in replies if r.command_id == forward.command_id)
    assert body_of(late).outcome == "failure"
    assert body_of(late).error == "compensated before it arrived"
    assert world.effects.calls[forward.command_id] == 0
    assert await world.ledger() == [("undo-1", 0)]

"""The engine's side of the wire, for participant tests: it sends commands and reads the
replies and dead letters, on the real Kafka. A ledger table records handler effects."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from pydantic import BaseModel

from saga_engine.participant import Participant, Rejected, Retryable, Transaction
from saga_engine.protocol import Envelope, Headers, MessageType, Topics, decode, encode
from saga_engine.settings import (
    AdminSettings,
    EngineSettings,
    KafkaSettings,
    ParticipantSettings,
    PostgresSettings,
    Settings,
)
from tests.waiting import eventually

if TYPE_CHECKING:
    from tests.conftest import PgTarget
    from tests.participant.test_participant import World

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
PARTICIPANT = "ledger"


# --------------------------------------------------------------------------- commands


class Reserve(BaseModel):
    amount: int
    delay_s: float = 0.0


class Reserved(BaseModel):
    reservation: str
    amount: int


class Flaky(BaseModel):
    fail_times: int


class Busy(BaseModel):
    """Answered ``Retryable`` (after ``after_s``, if given) after writing to the ledger."""

    after_s: float | None = None


def command(
    subject: str,
    body: Any,
    *,
    saga_id: str | None = None,
    command_id: str | None = None,
    step: str = "reserve",
) -> Envelope:
    """A command as the engine sends it."""
    saga = saga_id or f"saga-{uuid.uuid4().hex[:8]}"
    return Envelope(
        message_type=MessageType.COMMAND,
        source="/saga-engine/test",
        subject=subject,
        saga_id=saga,
        saga_type="Checkout",
        command_id=command_id or f"{saga}:{step}:0",
        step=step,
        correlation_id=saga,
        reply_to="",  # the participant falls back to the inbox
        traceparent=TRACEPARENT,
        body=body,
    )


def resent(envelope: Envelope) -> Envelope:
    """The same command sent again, as a retry or replay does: a new message id."""
    return envelope.model_copy(update={"id": str(uuid.uuid4())})


# --------------------------------------------------------------------------- handlers


@dataclass
class Effects:
    """What the handlers did, besides the ledger: calls per command id."""

    calls: Counter[str] = field(default_factory=Counter)


#: The handlers below count their calls in memory (``Effects``), an effect outside their
#: transaction: they are registered so (``effects="outside"``), which keeps them on the
#: locked claim, where a copy whose reply is stored never runs its handler, and the
#: tests can count calls. The optimistic claim (every effect in the transaction) is
#: tested with handlers that write to the ledger alone (tests/internal/participant/test_optimistic_claim.py).
OUTSIDE: Final = "outside"


def ledger_participant(settings: Settings, effects: Effects, **options: Any) -> Participant:
    participant = Participant(PARTICIPANT, settings, **options)

    @participant.handles(Reserve, effects=OUTSIDE)
    async def reserve(cmd: Reserve, tx: Transaction) -> Reserved:
        effects.calls[tx.command_id] += 1
        # Written first, so that a refusal has a partial write to roll back.
        await tx.execute(
            "INSERT INTO ledger (command_id, amount) VALUES ($1, $2)", tx.command_id, cmd.amount
        )
        if cmd.delay_s:
            await asyncio.sleep(cmd.delay_s)
        if cmd.amount > 100:
            raise Rejected("insufficient credit", details={"requested": cmd.amount, "limit": 100})
        return Reserved(reservation=f"r-{tx.command_id}", amount=cmd.amount)

    @participant.handles(Flaky, effects=OUTSIDE)
    async def flaky(cmd: Flaky, tx: Transaction) -> dict[str, Any]:
        effects.calls[tx.command_id] += 1
        await tx.execute("INSERT INTO ledger (command_id, amount) VALUES ($1, 0)", tx.command_id)
        if effects.calls[tx.command_id] <= cmd.fail_times:
            raise RuntimeError(f"flaky failure {effects.calls[tx.command_id]}")
        return {"attempt": tx.attempt}

    async def busy(cmd: Busy, tx: Transaction) -> None:
        effects.calls[tx.command_id] += 1
        # Written first, so that the answer has a partial write to roll back.
        await tx.execute("INSERT INTO ledger (command_id, amount) VALUES ($1, -1)", tx.command_id)
        raise Retryable("busy", after=cmd.after_s)

    # At the batch's isolation level (read committed), and at another: a handler that
    # asks for one gets a transaction of its own.
    participant.handles(Busy, effects=OUTSIDE)(busy)
    participant.handles(Busy, name="BusyAlone", isolation="repeatable_read", effects=OUTSIDE)(busy)
    return participant


async def create_ledger(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "CREATE TABLE ledger (id bigserial PRIMARY KEY, command_id text NOT NULL, amount int)"
        )
    finally:
        await conn.close()


async def query(dsn: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


# --------------------------------------------------------------------------- the wire


class Bus:
    """Sends commands to the participant's topic; collects its replies and dead letters
    from the start of the inbox and dead-letter topics (no consumer group)."""

    def __init__(self, kafka: KafkaSettings) -> None:
        self.kafka = kafka
        self.topics = Topics.of(kafka)
        self.command_topic = self.topics.commands(PARTICIPANT)
        self._producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
        self._inbox = self._reader(self.topics.inbox)
        self._dlq = self._reader(self.topics.dlq)
        self.replies: list[Envelope] = []
        self.reply_headers: list[dict[str, str]] = []
        self.dead: list[Any] = []

    def _reader(self, topic: str) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topic,
            bootstrap_servers=self.kafka.bootstrap_servers,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=20,
        )

    async def start(self) -> None:
        await self._producer.start()
        await self._inbox.start()
        await self._dlq.start()

    async def stop(self) -> None:
        await self._producer.stop()
        await self._inbox.stop()
        await self._dlq.stop()

    async def send(self, envelope: Envelope, *, partition: int | None = None) -> None:
        key, value, headers = encode(envelope)
        await self.send_raw(key, value, headers, partition=partition)

    async def send_raw(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        *,
        partition: int | None = None,
    ) -> None:
        await self._producer.send_and_wait(
            self.command_topic, value, key=key, headers=headers, partition=partition
        )

    async def wait_replies(self, count: int, *, timeout: float = 20.0) -> list[Envelope]:
        """Waits until at least ``count`` replies have arrived; returns all of them."""

        async def enough() -> bool:
            for records in (await self._inbox.getmany(timeout_ms=100)).values():
                for r in records:
                    headers = list(r.headers)
                    self.replies.append(decode(r.key, r.value, headers, max_bytes=10_000_000))
                    self.reply_headers.append({k: v.decode() for k, v in headers})
            return len(self.replies) >= count

        await eventually(enough, timeout=timeout, interval=0, what=f"{count} replies")
        return list(self.replies)

    async def wait_dead_letters(self, count: int, *, timeout: float = 20.0) -> list[Any]:
        async def enough() -> bool:
            for records in (await self._dlq.getmany(timeout_ms=100)).values():
                self.dead.extend(records)
            return len(self.dead) >= count

        await eventually(enough, timeout=timeout, interval=0, what=f"{count} dead letters")
        return list(self.dead)


async def delete_topics(bootstrap: str, prefix: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        mine = [t for t in await admin.list_topics() if t.startswith(prefix + ".")]
        if mine:
            await admin.delete_topics(mine)
    finally:
        await admin.close()


# --------------------------------------------------------------------------- one batch


async def send_first(world: World, *envelopes: Envelope) -> None:
    """Puts the commands on partition 0, in this order, before any participant reads:
    its first fetch takes them together, as one batch."""
    assert not world.running, "send before the participant starts, so it fetches them at once"
    for envelope in envelopes:
        await world.bus.send(envelope, partition=0)


async def start(
    world: World,
    *,
    settings: Settings | None = None,
    register: Callable[[Participant], None] | None = None,
    **options: Any,
) -> Participant:
    """As ``world.participant()``, with other settings or more handlers."""
    options.setdefault("backoff_base_s", 0.01)
    participant = ledger_participant(settings or world.settings, world.effects, **options)
    if register is not None:
        register(participant)
    world.running.append(participant)
    await participant.start()
    return participant


def compensation_of(forward: Envelope, subject: str, body: Any, command_id: str) -> Envelope:
    return command(
        subject, body, saga_id=forward.saga_id, command_id=command_id, step=forward.step
    ).model_copy(update={"compensation": True, "compensates": forward.command_id})


def by_id(replies: list[Envelope]) -> dict[str, Envelope]:
    answered: dict[str, Envelope] = {}
    for reply in replies:
        assert reply.command_id not in answered, f"{reply.command_id} answered twice"
        answered[reply.command_id] = reply
    return answered


# --------------------------------------------------------------------------- with an engine


@contextlib.asynccontextmanager
async def engine_settings(
    pg: PgTarget,
    kafka_bootstrap: str,
    unique_id: str,
    participant: str,
    *,
    ddl: str = "",
    **options: Any,
) -> AsyncIterator[Settings]:
    """Settings for an engine worker and a participant in this process: the participant's
    schema is named after it (``ddl`` run in it first; ``options`` go to its settings),
    and it and the topics are dropped afterwards."""
    prefix = f"t{unique_id}"
    schema = f"{pg.schema}_{participant}"
    if ddl:
        conn = await asyncpg.connect(pg.database_dsn)
        try:
            await conn.execute(f'CREATE SCHEMA "{schema}"')
            await conn.execute(f'SET search_path TO "{schema}"')
            await conn.execute(ddl)
        finally:
            await conn.close()
    try:
        yield Settings(
            pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
            kafka=KafkaSettings(
                bootstrap_servers=kafka_bootstrap,
                topic_prefix=prefix,
                group_id=f"engines-{unique_id}",
                partitions=2,
            ),
            participant=ParticipantSettings(dsn=pg.database_dsn, db_schema=schema, **options),
            engine=EngineSettings(),
            admin=AdminSettings(enabled=False, port=0),
        )
    finally:
        await delete_topics(kafka_bootstrap, prefix)
        await query(pg.dsn, f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

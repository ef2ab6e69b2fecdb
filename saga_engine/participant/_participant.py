"""Internals of the participant kit (``saga_engine.participant``).

Everything here is about one command record: the :class:`Transaction` a handler
receives, the SQL of the deduplication table and the reply outbox, how a reply becomes a
Kafka record, how errors are classified (retry the record, retry the handler, or give
up), and :class:`CommandProcessor`, which takes a record from decoding to a committed,
published reply or to the dead-letter topic. ``saga_engine.participant`` owns the
consumer, ordering, rebalancing, the outbox relay and the lifecycle.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias

import asyncpg
import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from opentelemetry.trace import Span
from pydantic import BaseModel, ValidationError

from saga_engine.core._codec import CodecChain
from saga_engine.kernel._errors import (
    InvalidPayload,
    PoisonMessage,
    PoisonReason,
    Rejected,
    Retryable,
    TransientError,
    UnstorableValue,
)
from saga_engine.kernel._retry import Backoff, jittered
from saga_engine.kernel._serde import (
    JsonDict,
    check_storable,
    storable_copy,
    unstorable,
    without_input,
)
from saga_engine.kernel._settings import Settings
from saga_engine.participant._sql import (
    CLAIM,
    RECORD_OUTCOME,
    STORED_REPLY,
    TOMBSTONE,
    TOMBSTONE_REPLY,
    Connection,
    Outgoing,
    check_size,
    insert_outbox,
    publish,
    reply_record,
    stored_reply,
)
from saga_engine.telemetry._telemetry import Telemetry, carrier_of, default_telemetry
from saga_engine.transport._kafka import DeadLetters, ensure_topics
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import (
    Envelope,
    MessageType,
    ReplyBody,
    decode,
)

log = logging.getLogger("saga_engine.participant")

Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"
Isolation = Literal["read_committed", "repeatable_read", "serializable"]
#: What a handler may return: its reply payload.
HandlerResult: TypeAlias = BaseModel | Mapping[str, Any] | None
CrashHook = Callable[[str], None]

#: A topic name Kafka accepts (a reply_to header is checked against it before use).
TOPIC_NAME: Final = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
#: Longest command id the deduplication table accepts (its CHECK constraint).
MAX_COMMAND_ID: Final = 200


# --------------------------------------------------------------------------- public types


#: What a handler raises to answer rather than crash: its writes roll back and the
#: answer is recorded in the same transaction (the claim kept).
HandlerAnswer: TypeAlias = Rejected | Retryable


def answer_reply(answer: HandlerAnswer) -> ReplyBody:
    """The reply a handler's Rejected or Retryable stands for. It is recorded whatever it
    says: what Postgres cannot store is written out as escapes."""
    if isinstance(answer, Rejected):
        return ReplyBody(
            outcome="failure",
            payload=storable_copy(json_payload(answer.details)),
            error=storable_copy(answer.reason),
        )
    if answer.after is None:
        return ReplyBody(outcome="retryable", error=storable_copy(answer.reason))
    seconds = answer.after.total_seconds()
    return ReplyBody(
        outcome="retryable",
        payload={"retry_after_s": seconds},
        error=storable_copy(f"{answer.reason} (retry after {seconds:g}s)"),
    )


def unstorable_body(command: Envelope) -> UnstorableValue | None:
    """Why Postgres could not record ``command``'s handling (nor, often, the handler its
    effect), or None: such a command is refused at once, with a reply that says where,
    so the step fails now instead of waiting out its timeout."""
    problems = unstorable(command.body)
    return (
        UnstorableValue(f"{command.subject or 'the command'} body", problems) if problems else None
    )


def refusal_reply(invalid: InvalidPayload) -> ReplyBody:
    """The failure reply to a command whose body is refused before its handler runs."""
    return ReplyBody(
        outcome="failure", payload={"errors": invalid.errors}, error=str(invalid)[:2000]
    )


def answer_counter(answer: HandlerAnswer) -> str:
    """The stats counter of a handler's answer: the one its outcome has anyway."""
    return "rejected" if isinstance(answer, Rejected) else "retryable"


class Transaction:
    """The participant's own database transaction a handler runs in, and the command's ids.

    ``connection`` is the asyncpg connection, inside a transaction that also records the
    command as processed: commit and rollback belong to the participant, so a handler
    must not end the transaction itself (nested ``connection.transaction()`` blocks are
    savepoints and are fine). ``execute``/``fetch``/``fetchrow``/``fetchval`` delegate to
    it. ``attempt`` counts from 1; it grows when a previous attempt raised.
    """

    __slots__ = (
        "attempt",
        "command_id",
        "command_type",
        "compensation",
        "connection",
        "participant",
        "saga_id",
        "saga_type",
        "step",
        "trace_context",
    )

    def __init__(
        self, connection: Connection, command: Envelope, *, participant: str, attempt: int
    ) -> None:
        self.connection = connection
        self.participant = participant
        self.attempt = attempt
        self.command_id = command.command_id
        self.command_type = command.subject
        self.saga_id = command.saga_id
        self.saga_type = command.saga_type
        self.step = command.step
        self.compensation = command.compensation
        self.trace_context: dict[str, str] = {
            k: v
            for k, v in (("traceparent", command.traceparent), ("tracestate", command.tracestate))
            if v
        }

    # The delegates leave out asyncpg's per-call ``timeout``; use ``tx.connection`` for it.
    async def execute(self, query: str, *args: Any) -> str:
        return await self.connection.execute(query, *args)

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        return await self.connection.fetch(query, *args)

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        return await self.connection.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any, column: int = 0) -> Any:
        return await self.connection.fetchval(query, *args, column=column)

    def __repr__(self) -> str:
        return (
            f"Transaction(participant={self.participant!r}, command_id={self.command_id!r}, "
            f"saga_id={self.saga_id!r}, step={self.step!r}, attempt={self.attempt})"
        )


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    command_type: str
    model: type[BaseModel]
    fn: Callable[[Any, Transaction], Awaitable[HandlerResult]]
    isolation: Isolation


# --------------------------------------------------------------------------- control flow


class HandlerFailed(Exception):
    """A handler raised something other than Rejected or Retryable; its transaction was
    rolled back."""

    def __init__(self, cause: BaseException) -> None:
        self.cause = cause
        super().__init__(f"{type(cause).__name__}: {cause}")


class Abandoned(Exception):
    """The participant is stopping: the record is left for the next consumer (its offset
    is not committed), which deduplicates whatever this one already committed."""


class CrashPoint(BaseException):
    """The crash hook raised at a crash point: the process is to be considered dead.

    A BaseException, so that no ``except Exception`` on the way treats a simulated death
    as an error to recover from; ``Participant.run`` re-raises the hook's own exception.
    """

    def __init__(self, point: str, original: BaseException) -> None:
        self.point = point
        self.original = original
        super().__init__(f"crash hook raised at {point}: {original!r}")


# The errors after which the same work may succeed a moment later: lost or refused
# connections, a server shutting down or out of connections, serialization failures and
# deadlocks (class 40), and Kafka being unreachable. Anything else is a bug or a broken
# schema, and retrying it forever would stall the partition.
_TRANSIENT: Final[tuple[type[BaseException], ...]] = (
    TransientError,
    KafkaError,
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.TransactionRollbackError,
)


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, _TRANSIENT)


def json_payload(result: object) -> JsonDict:
    """A handler's return value (or a refusal's details) as a JSON object; raises TypeError."""
    if result is None:
        return {}
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    if isinstance(result, Mapping):
        # The round trip proves the value is JSON now, inside the handler's attempt,
        # rather than failing later when the reply is written.
        value: JsonDict = orjson.loads(orjson.dumps(dict(result), option=orjson.OPT_UTC_Z))
        return value
    raise TypeError(
        f"a handler must return a pydantic model, a dict or None, not {type(result).__name__}"
    )


# --------------------------------------------------------------------------- processing


class CommandProcessor:
    """Takes one command record to its end: answered (the reply committed with the
    command's outcome, then published) or dead-lettered. ``Participant`` owns the
    consumer, the ordering and the lifecycle; this owns what happens to a record."""

    def __init__(
        self,
        *,
        name: str,
        settings: Settings,
        handlers: Mapping[str, HandlerSpec],
        pool: Pool,
        producer: AIOKafkaProducer,
        stats: collections.Counter[str],
        stopping: asyncio.Event,
        crash_hook: CrashHook | None,
        backoff: tuple[float, float],
        instance_id: str,
        telemetry: Telemetry | None = None,
        codec: CodecChain | None = None,
    ) -> None:
        self.name = name
        #: Opens the commands read, seals the replies sent and stored (None: as they are).
        self.codec = codec
        self.settings = settings
        self.topics = Topics.of(settings.kafka)
        self.instance_id = instance_id
        self.stats = stats
        self._handlers = handlers
        self._pool = pool
        self._producer = producer
        self._dead = DeadLetters(producer, self.topics.dlq)
        self._stopping = stopping
        self._crash_hook = crash_hook
        self._backoff = backoff
        self._telemetry = telemetry or default_telemetry()
        self._source = f"/participants/{name}"
        # Reply topics known to exist (the inbox is created at start).
        self._reply_topics = {self.topics.inbox}
        #: Outbox rows published and not yet marked. Why not at once: a round trip per
        #: reply was a large share of a participant's work. The next batch's transaction
        #: marks them (BatchRunner). A row left unmarked is what a crash right after
        #: publishing leaves anyway: the relay publishes it again after its grace
        #: period, and the engine drops the duplicate reply.
        self.unmarked: list[int] = []

    async def handle(self, record: Any) -> None:
        """Processes one record to the end: replied to, or dead-lettered. Retries
        transient failures (Postgres or Kafka away) until it succeeds or the participant
        stops (Abandoned); dead-letters a record whose processing fails for any other
        reason, so that a bug or a broken schema never stalls the partition."""
        await self._retrying(record, lambda: self._process(record))

    async def _retrying(self, record: Any, attempt: Callable[[], Awaitable[None]]) -> None:
        """Runs ``attempt`` until it succeeds: an outage is retried with backoff (until the
        participant stops: Abandoned), anything else dead-letters the record."""
        backoff = Backoff(0.1, 5.0)
        while True:
            try:
                await attempt()
                return
            except Exception as exc:
                if isinstance(exc, Abandoned):
                    raise
                if not is_transient(exc):
                    log.exception("participant %s: cannot process a record", self.name)
                    await self._dead_letter(
                        record, PoisonReason.ENGINE_ERROR, f"{type(exc).__name__}: {exc}"
                    )
                    return
                delay = backoff.next_delay()
                log.warning("transient failure (%r); retrying in %.2fs", exc, delay)
                await self.pause(delay)

    async def _process(self, record: Any) -> None:
        try:
            command, refused = self.read_command(record)
        except PoisonMessage as poison:
            await self._dead_letter(record, poison.reason.value, poison.detail)
            return
        with self.command_span(record, command) as span:
            await self._handle_command(record, self.traced(command, span), refused)

    @contextlib.contextmanager
    def command_span(self, record: Any, command: Envelope) -> Iterator[Span]:
        """The "handle {CommandType}" span of one command."""
        # The traceparent is read from the record's own headers (aiokafka's
        # instrumentation does not carry it): this span is a child of the engine's step
        # span, and the reply (built from ``traced(command, span)``) carries this span's
        # context back.
        received = {
            k: v
            for k, v in (("traceparent", command.traceparent), ("tracestate", command.tracestate))
            if v
        }
        attributes = {
            "saga.id": command.saga_id,
            "saga.type": command.saga_type,
            "step": command.step,
            "command.id": command.command_id,
            "compensation": command.compensation,
            "participant": self.name,
            "messaging.system": "kafka",
            "messaging.destination.name": getattr(record, "topic", None),
        }
        with self._telemetry.consumer_span(command.subject, received, attributes) as span:
            yield span

    @staticmethod
    def traced(command: Envelope, span: Span) -> Envelope:
        """``command`` carrying ``span``'s context, so its reply continues the trace."""
        carrier = carrier_of(span)
        if not carrier:
            return command
        return command.model_copy(
            update={
                "traceparent": carrier.get("traceparent", ""),
                "tracestate": carrier.get("tracestate", ""),
            }
        )

    async def apply_alone(
        self,
        record: Any,
        command: Envelope,
        topic: str,
        handler: HandlerSpec,
        model: BaseModel,
        failure: Exception | None = None,
    ) -> None:
        """A checked command in a transaction of its own (the batch's path for a handler
        with another isolation level, or one whose first attempt raised in a batch:
        ``failure``), with the transient retries of ``handle``."""
        await self._alone(
            record,
            command,
            lambda traced: self._apply(traced, topic, handler, model, failure),
        )

    async def answer_alone(
        self, record: Any, command: Envelope, topic: str, reply: ReplyBody, counter: str
    ) -> None:
        """A reply decided without the handler, given in a transaction of its own (the
        record was dead-lettered already where that applies)."""
        await self._alone(
            record, command, lambda traced: self._answer(traced, topic, reply, counter=counter)
        )

    async def _alone(
        self, record: Any, command: Envelope, work: Callable[[Envelope], Awaitable[None]]
    ) -> None:
        async def attempt() -> None:
            with self.command_span(record, command) as span:
                await work(self.traced(command, span))

        await self._retrying(record, attempt)

    async def _handle_command(
        self, record: Any, command: Envelope, refused: InvalidPayload | None = None
    ) -> None:
        """Answers ``command`` (``refused``: its body, unreadable, was refused already)."""
        topic = command.reply_to or self.topics.inbox
        if topic not in self._reply_topics:
            # The outbox must only hold records that can be published: a reply topic that
            # does not exist would block the relay's queue (topics are never auto-created).
            await ensure_topics(self.settings.kafka, [topic])
            self._reply_topics.add(topic)
        invalid = refused or unstorable_body(command)
        if invalid is not None:
            await self._dead_letter(record, PoisonReason.UNSTORABLE_VALUE.value, str(invalid))
            await self._answer(command, topic, refusal_reply(invalid), counter="unstorable")
            return
        handler = self._handlers.get(command.subject)
        if handler is None:
            error = f"participant {self.name} cannot handle {command.subject or '(no ce_subject)'}"
            details = {"command_type": command.subject, "handles": sorted(self._handlers)}
            await self._answer(
                command,
                topic,
                ReplyBody(outcome="failure", payload=details, error=error),
                counter="unknown_command",
            )
            return
        try:
            model = handler.model.model_validate(command.body)
        except ValidationError as exc:
            detail = (
                f"{command.subject} body is not a valid {handler.model.__name__}: "
                f"{without_input(exc)}"
            )
            await self._dead_letter(record, PoisonReason.INVALID_BODY.value, detail)
            errors = orjson.loads(exc.json(include_url=False, include_input=False))
            reply = ReplyBody(
                outcome="failure",
                payload={"errors": errors[:20]},
                error=f"invalid {command.subject} body: {exc.error_count()} validation error(s)",
            )
            await self._answer(command, topic, reply, counter="invalid_body")
            return
        await self._apply(command, topic, handler, model)

    def read_command(self, record: Any) -> tuple[Envelope, InvalidPayload | None]:
        """The record's command and, when only its body was refused (too deep to read),
        that refusal: the command is answered with it, like a body that cannot be
        stored. PoisonMessage for a record that cannot be answered at all. The one way
        in for both the single and the batch path."""
        try:
            return self._read(record), None
        except PoisonMessage as poison:
            if not isinstance(poison.envelope, Envelope) or poison.body_error is None:
                raise
            return poison.envelope, poison.body_error

    def _read(self, record: Any) -> Envelope:
        """The record's command; PoisonMessage for one that cannot be answered (or, with
        its ``envelope`` set, whose body alone is refused: its headers passed these
        checks, so it is answered with the refusal)."""
        try:
            command = decode(
                record.key,
                record.value,
                list(record.headers or []),
                max_bytes=self.settings.kafka.max_message_bytes,
                codec=self.codec,
            )
        except PoisonMessage as poison:
            if isinstance(poison.envelope, Envelope):
                self._check_headers(poison.envelope)
            raise
        self._check_headers(command)
        return command

    @staticmethod
    def _check_headers(command: Envelope) -> None:
        if command.message_type is not MessageType.COMMAND:
            raise PoisonMessage(
                PoisonReason.UNKNOWN_TYPE,
                f"{command.message_type.value} does not belong on a participant's command topic",
            )
        if not command.command_id or len(command.command_id) > MAX_COMMAND_ID:
            raise PoisonMessage(
                PoisonReason.MISSING_HEADER,
                f"a command needs a ce_commandid of 1 to {MAX_COMMAND_ID} characters",
            )
        if command.reply_to and not TOPIC_NAME.match(command.reply_to):
            raise PoisonMessage(
                PoisonReason.MISSING_HEADER, f"ce_replyto {command.reply_to!r} is not a topic name"
            )
        ids = {
            "ce_commandid": command.command_id, "ce_sagaid": command.saga_id,
            "ce_step": command.step, "ce_subject": command.subject,
            "ce_compensates": command.compensates,
        }  # fmt: skip
        problems = unstorable(ids)
        if problems:
            # These go into the deduplication table's text columns: with one that cannot
            # be stored, no answer can be recorded, so none is sent.
            raise PoisonMessage(
                PoisonReason.UNSTORABLE_VALUE,
                str(UnstorableValue("the command's headers", problems)),
            )

    # ------------------------------------------------------------------ one command

    async def _apply(
        self,
        command: Envelope,
        topic: str,
        handler: HandlerSpec,
        model: BaseModel,
        failure: Exception | None = None,
    ) -> None:
        """The handler's attempts. ``failure``: attempt 1 already raised (in a batch, which
        counted it), so this starts at attempt 2, after its backoff."""
        attempts = self.settings.participant.handler_attempts
        first = 1
        if failure is not None:
            first = 2
            failed = HandlerFailed(failure)
            if attempts < 2:
                await self._give_up(command, topic, failed, attempts)
                return
            await self._retry_later(command, failed, 1, attempts)
        for attempt in range(first, attempts + 1):
            try:
                outgoing, duplicate, answered = await self._transact(
                    command, topic, handler=handler, model=model, attempt=attempt
                )
            except HandlerFailed as failed:
                self.stats["handler_errors"] += 1
                if attempt < attempts:
                    await self._retry_later(command, failed, attempt, attempts)
                    continue
                await self._give_up(command, topic, failed, attempts)
                return
            self.stats["duplicates" if duplicate else "processed"] += 1
            if answered and not duplicate:
                self.stats[answered] += 1
            await self._deliver(outgoing)
            return

    async def _retry_later(
        self, command: Envelope, failed: HandlerFailed, attempt: int, attempts: int
    ) -> None:
        # The handler's attempts are this loop's failures: attempt n waits as a Backoff's
        # n-th delay would.
        delay = jittered(attempt, *self._backoff, random.random)
        log.warning(
            "participant %s: %s %s attempt %d/%d failed (%s); retrying in %.2fs",
            self.name,
            command.subject,
            command.command_id,
            attempt,
            attempts,
            failed,
            delay,
        )
        await self.pause(delay)

    async def _give_up(
        self, command: Envelope, topic: str, failed: HandlerFailed, attempts: int
    ) -> None:
        log.error(
            "participant %s: %s %s failed %d times; replying retryable",
            self.name,
            command.subject,
            command.command_id,
            attempts,
            exc_info=failed.cause,
        )
        # Recorded like any answer, in a transaction of its own (the failed one rolled
        # back): the engine abandons this command id for a new one, so a copy of it
        # processed later must not apply anything (PROTOCOL.md 7.3).
        reply = ReplyBody(outcome="retryable", error=storable_copy(str(failed)[:2000]))
        await self._answer(command, topic, reply, counter="retryable")

    async def _transact(
        self,
        command: Envelope,
        topic: str,
        *,
        handler: HandlerSpec | None = None,
        model: BaseModel | None = None,
        fixed: ReplyBody | None = None,
        attempt: int = 1,
    ) -> tuple[Outgoing, bool, str | None]:
        """One transaction: claim the command id, decide the reply (the handler's or
        ``fixed``), record it and write it to the outbox. Returns (reply, duplicate, the
        counter of the handler's Rejected or Retryable, if it raised one). Raises
        HandlerFailed, having rolled everything back, if the handler raised anything
        else."""
        limit = self._reply_limit
        isolation = handler.isolation if handler is not None else "read_committed"
        async with self._pool.acquire() as conn, conn.transaction(isolation=isolation):
            claimed = await conn.fetchval(
                CLAIM, command.command_id, command.saga_id, command.subject, command.step
            )
            if claimed is None:
                # Processed before (and committed, or the claim would still be waiting):
                # the same answer again, without running the handler.
                stored = stored_reply(
                    await conn.fetchval(STORED_REPLY, command.command_id), self.codec
                )
                outgoing = reply_record(
                    command, stored, source=self._source, topic=topic, codec=self.codec
                )
                await insert_outbox(conn, outgoing)
                return outgoing, True, None
            forward_ids = [i for i in command.compensates.split(",") if i]
            if command.compensation and forward_ids:
                # Tombstones: a forward command that arrives after its compensation (a
                # re-send delayed in a broker, across an ownership change) must find
                # itself already answered, and never be applied. ON CONFLICT keeps the
                # real record of a forward command that was processed.
                await conn.execute(
                    TOMBSTONE, forward_ids, command.saga_id, command.step, TOMBSTONE_REPLY
                )
            answered: str | None = None
            if fixed is not None:
                outgoing = self._fitted(command, fixed, topic)
            else:
                assert handler is not None
                assert model is not None
                tx = Transaction(conn, command, participant=self.name, attempt=attempt)
                try:
                    try:
                        # A savepoint: a refusal (or Retryable) undoes the handler's writes
                        # but keeps the claim, so the answer is recorded in this transaction.
                        async with conn.transaction():
                            result = await handler.fn(model, tx)
                            payload = json_payload(result)
                            # A handler's bug (an exception): its writes roll back.
                            check_storable(payload, f"the reply of the {command.subject} handler")
                            reply = ReplyBody(outcome="success", payload=payload)
                            outgoing = reply_record(
                                command, reply, source=self._source, topic=topic, codec=self.codec
                            )
                            check_size(outgoing, limit)
                    except (Rejected, Retryable) as answer:
                        # An answer, not a crash: no in-process retry (a Retryable asks
                        # the engine for a new attempt at once).
                        answered = answer_counter(answer)
                        outgoing = self._fitted(command, answer_reply(answer), topic)
                except Exception as exc:
                    # Leaving the outer block with an exception rolls the whole
                    # transaction back, the claim included: nothing is recorded, and a
                    # later attempt (or redelivery) starts from scratch.
                    raise HandlerFailed(exc) from exc
            await conn.execute(
                RECORD_OUTCOME,
                command.command_id,
                outgoing.reply.outcome,
                # The reply's Kafka value is its JSON (sealed, with a codec) already.
                outgoing.value.decode(),
                outgoing.reply.error,
            )
            await insert_outbox(conn, outgoing)
        return outgoing, False, answered

    @property
    def _reply_limit(self) -> int:
        # The engine refuses reply payloads above its own limit, which may be lower than
        # what Kafka carries: an answer it would refuse must not be recorded as given.
        return min(self.settings.kafka.max_message_bytes, self.settings.engine.max_payload_bytes)

    def _fitted(self, command: Envelope, reply: ReplyBody, topic: str) -> Outgoing:
        """A failure or retryable reply, shrunk to fit the size limit rather than not
        sent at all."""
        outgoing = reply_record(command, reply, source=self._source, topic=topic, codec=self.codec)
        if outgoing.size <= self._reply_limit:
            return outgoing
        small = ReplyBody(
            outcome=reply.outcome,
            payload={"truncated": True},
            error=(reply.error or "")[:1000],
        )
        return reply_record(command, small, source=self._source, topic=topic, codec=self.codec)

    async def _answer(
        self, command: Envelope, topic: str, reply: ReplyBody, *, counter: str
    ) -> None:
        """Records and sends a reply decided without running the handler (an unknown
        type, an invalid body, a handler that kept failing), unless the command was
        answered before: then the stored answer wins."""
        outgoing, duplicate, _ = await self._transact(command, topic, fixed=reply)
        if duplicate:
            self.stats["duplicates"] += 1
        else:
            self.stats["processed"] += 1
            self.stats[counter] += 1
        await self._deliver(outgoing)

    async def _deliver(self, outgoing: Outgoing) -> None:
        """Publishes a committed reply; its outbox row is marked by the next batch's
        transaction (or when the participant idles). Failures here lose nothing: the row
        stays unpublished and the relay sends it."""
        self._checkpoint("after_commit")
        try:
            await publish(
                self._producer, outgoing.topic, outgoing.key, outgoing.value, outgoing.headers
            )
        except Exception as exc:
            log.warning("reply %s not published (%r); the relay will", outgoing.command_id, exc)
            return
        if outgoing.row_id is not None:
            self.unmarked.append(outgoing.row_id)
        self._checkpoint("after_publish")

    # ------------------------------------------------------------------ side paths

    async def _dead_letter(self, record: Any, reason: str, detail: str) -> None:
        backoff = Backoff(0.1, 5.0)
        while True:
            try:
                await self._dead.publish_record(
                    record,
                    reason=reason,
                    detail=detail,
                    consumer=f"participant:{self.name}:{self.instance_id}",
                )
                break
            except Exception as exc:
                if not is_transient(exc):
                    raise
                await self.pause(backoff.next_delay())
        self.stats["dead_lettered"] += 1
        self.stats[f"dead_lettered_{reason}"] += 1

    async def pause(self, delay: float) -> None:
        """Sleeps ``delay`` seconds; raises Abandoned if the participant stops meanwhile."""
        try:
            await asyncio.wait_for(self._stopping.wait(), delay)
        except TimeoutError:
            return
        raise Abandoned

    def _checkpoint(self, point: str) -> None:
        if self._crash_hook is None:
            return
        try:
            self._crash_hook(point)
        except BaseException as exc:
            raise CrashPoint(point, exc) from exc

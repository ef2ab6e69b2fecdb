"""The participant kit's records and statements: a reply as the Kafka record that carries
it (and as its outbox row), and the SQL of the deduplication table
(``saga_processed_commands``) and the reply outbox (``saga_reply_outbox``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain
from types import MappingProxyType
from typing import Final, TypeAlias

import asyncpg
import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from asyncpg.pool import PoolConnectionProxy
from pydantic import ValidationError

from saga_engine.core.history._codec import MARKER, CodecChain, is_marker
from saga_engine.kernel._errors import CodecError, CodecFailure, KafkaUnavailable
from saga_engine.kernel._serde import JsonDict, model_payload
from saga_engine.kernel._settings import check_message_size
from saga_engine.transport._timings import TIMING_BYTES, echoed_time, wire_time_bytes
from saga_engine.transport._wire import Envelope, Headers, MessageType, ReplyBody, encode_fields

Connection: TypeAlias = "PoolConnectionProxy[asyncpg.Record]"

#: The blobs of a reply that went inline: none.
NO_BLOBS: Final[Mapping[str, bytes]] = MappingProxyType({})


# --------------------------------------------------------------------------- replies


@dataclass(slots=True)
class Outgoing:
    """A reply as the Kafka record that carries it."""

    command_id: str
    saga_id: str
    topic: str
    key: bytes
    value: bytes
    headers: Headers
    reply: ReplyBody
    #: The blob of a reply by reference (content hash -> bytes): kept before the
    #: transaction that records the reply commits, so before the record is sent.
    blobs: Mapping[str, bytes] = field(default_factory=lambda: NO_BLOBS)

    @property
    def headers_json(self) -> str:
        """The headers as the outbox stores them: a JSON list of [name, value] pairs."""
        return orjson.dumps([[k, v.decode()] for k, v in self.headers]).decode()

    @property
    def size(self) -> int:
        """Its bytes as sent: the timing headers it gets after the commit counted in."""
        return len(self.value) + sum(map(len, chain.from_iterable(self.headers))) + TIMING_BYTES


def reply_record(
    command: Envelope,
    reply: ReplyBody,
    *,
    source: str,
    topic: str,
    codec: CodecChain | None,
    by_reference: bool = False,
    body: JsonDict | None = None,
) -> Outgoing:
    """The reply to ``command``: keyed by saga id, answering the command's own message id,
    with its trace context, so the saga's trace continues through the participant. With a
    codec its value is sealed, and so are the outbox row and the stored reply made of it;
    ``by_reference``: a large one goes by reference (``Outgoing.blobs``). ``body``:
    ``reply`` as JSON (``success_body``), when the caller made it."""
    # The command was decoded and checked, so its values need no second validation: the
    # reply's fields go to the encoder as they are.
    fields = {
        "message_type": MessageType.REPLY,
        "source": source,
        "subject": command.subject,
        "saga_id": command.saga_id,
        "saga_type": command.saga_type,
        "command_id": command.command_id,
        "step": command.step,
        "correlation_id": command.correlation_id or command.saga_id,
        "causation_id": command.id,
        "time": wire_time_bytes(time.time()),  # RFC 3339 in UTC, as every time on the wire
        "compensation": command.compensation,
        "traceparent": command.traceparent,
        "tracestate": command.tracestate,
        # Echoed: the engine reads the command's whole journey off its reply. The other
        # timing headers are added once the reply's transaction committed (_handler_timing).
        "sent_time": echoed_time(command.sent_time),
    }
    blobs: dict[str, bytes] | None = {} if by_reference else None
    if body is None:
        body = model_payload(reply)
    key, value, headers = encode_fields(fields, body, codec, blobs=blobs)
    return Outgoing(
        command.command_id, command.saga_id, topic, key, value, headers, reply, blobs or NO_BLOBS
    )


def success_body(payload: JsonDict) -> tuple[ReplyBody, JsonDict]:
    """The success reply of a handler's ``payload`` (JSON already, ``json_payload``),
    and the reply as JSON: what ``model_payload`` makes of it, without the serializer
    called for each command."""
    return (
        ReplyBody(outcome="success", payload=payload),
        {"outcome": "success", "payload": payload, "error": None},
    )


def check_size(outgoing: Outgoing, limit: int, blob_limit: int) -> None:
    """The reply's record within the message size, and a reply by reference within the
    largest blob a reference may name (``codec.blobs.max_bytes``)."""
    check_message_size(outgoing.size, limit, "the reply")
    for blob in outgoing.blobs.values():
        check_message_size(len(blob), blob_limit, "the reply")


# --------------------------------------------------------------------------- SQL

# The claim of a batch's commands, the first statement of its transaction, before any
# handler runs: a transaction-scoped advisory lock per command id, and per forward id a
# compensation in the batch tombstones. A concurrent transaction holding one of them (a
# redelivery on another instance, after a rebalance; a late forward command racing its
# compensation) is waited for until it ends; the next statement, under READ COMMITTED a
# new snapshot, then sees what it committed. So a duplicate never runs its handler, as
# with a claim row inserted first, but the row is written once, with its outcome, at the
# end (RECORD_OUTCOMES): no 'pending' row updated later, which costs a second heap tuple
# and its index entries per command. The two-key form keeps these locks apart from the
# one-key locks an application takes; the class id spells "saga". Sorted, so that two
# batches claiming overlapping ids lock them in the same order and never deadlock.
CLAIM: Final = """
SELECT pg_advisory_xact_lock(1935763297, k)
FROM (SELECT DISTINCT hashtext(c) AS k FROM unnest($1::text[]) AS c ORDER BY k) AS s
"""

# Tombstones: a forward command that arrives after its compensation (a re-send delayed in
# a broker, across an ownership change) must find itself already answered, and never be
# applied. ON CONFLICT keeps the real record of a forward command that was processed.
TOMBSTONE_REPLY: Final = (
    '{"outcome": "failure", "payload": {}, "error": "compensated before it arrived"}'
)

TOMBSTONE: Final = """
INSERT INTO saga_processed_commands (command_id, saga_id, command_type, step, outcome, reply, error)
SELECT id, s, '(compensated)', st, 'failure', $4::jsonb, 'compensated before it arrived'
FROM unnest($1::text[], $2::text[], $3::text[]) AS x(id, s, st)
ON CONFLICT (command_id) DO NOTHING
"""

STORED_REPLIES: Final = """
SELECT command_id, reply::text AS reply FROM saga_processed_commands
WHERE command_id = ANY($1::text[])
"""

# Every fresh outcome with its reply, one row per command, written once. The claim's
# locks mean no other transaction of this kit inserts these ids meanwhile; on an
# optimistic pass this insert is the claim. An id stored already (a copy answered
# before, committed) is skipped, so RETURNING lists only the rows inserted and the
# caller sees the copy. An id another transaction is inserting right now is not visible
# here: the insert waits for it on the primary key, then goes on (it rolled back) or
# fails with a unique violation (it committed: OUTCOMES_KEY), which the caller takes as
# the same answer (ClaimLost): it rolls back and runs the batch again the locked way,
# which then finds the stored reply. Not ON CONFLICT DO NOTHING: its speculative
# insertion writes a second WAL record (a confirmation) for every command, 3 of the
# ~41 a three-step saga cost end to end (bench/e2e.py --wal-breakdown). OFFSET 0 keeps
# the check a probe of the primary key per row, as ON CONFLICT's was: pulled up into an
# anti-join, a batch of a few hundred on a table not analyzed yet was hashed against a
# sequential scan of the whole table.
RECORD_OUTCOMES: Final = """
INSERT INTO saga_processed_commands
    (command_id, saga_id, command_type, step, outcome, reply, error)
SELECT c, s, t, st, o, r::jsonb, e
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
    AS x(c, s, t, st, o, r, e)
WHERE NOT EXISTS (
    SELECT 1 FROM saga_processed_commands AS p WHERE p.command_id = x.c COLLATE "C" OFFSET 0
)
RETURNING command_id
"""

#: The primary key an outcome's insert violates when a concurrent transaction stored the
#: same command id first.
OUTCOMES_KEY: Final = "saga_processed_commands_pkey"

# The replies a batch could not publish, handed to the relay. created_at is the wall
# clock at the insert, not now() (the transaction's start): the relay's grace period
# counts from here.
INSERT_OUTBOX: Final = """
INSERT INTO saga_reply_outbox (command_id, saga_id, topic, key, headers, body, created_at)
SELECT c, s, t, k, h::jsonb, b::jsonb, clock_timestamp()
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[])
    AS x(c, s, t, k, h, b)
"""

MARK_PUBLISHED: Final = """
UPDATE saga_reply_outbox SET published_at = now()
WHERE id = ANY($1::bigint[]) AND published_at IS NULL
"""

# FOR UPDATE SKIP LOCKED: the rows stay locked while they are published, and another
# instance's relay skips them instead of publishing them a second time or waiting. The
# grace period gives a fresh row (a reply that failed to go out a moment ago, with Kafka
# perhaps still away) some time before it is tried again.
RELAY_BATCH: Final = """
SELECT id, topic, key, headers::text AS headers, body::text AS body
FROM saga_reply_outbox
WHERE published_at IS NULL AND created_at <= now() - make_interval(secs => $1)
ORDER BY id
LIMIT $2
FOR UPDATE SKIP LOCKED
"""


async def publish(
    producer: AIOKafkaProducer, topic: str, key: bytes, value: bytes, headers: Headers
) -> None:
    try:
        await producer.send_and_wait(topic, value, key=key, headers=headers)
    except KafkaError as exc:
        raise KafkaUnavailable(f"could not publish a reply to {topic}: {exc!r}") from exc


def stored_reply(text: str, codec: CodecChain | None) -> ReplyBody:
    """A reply as ``saga_processed_commands.reply`` holds it: its JSON, or (written with a
    codec) the marker of its JSON, which is what the reply's Kafka value is."""
    if codec is not None:
        marker = orjson.loads(text)
        if is_marker(marker):
            return ReplyBody.model_validate_json(codec.open_raw(marker))
    try:
        return ReplyBody.model_validate_json(text)
    except ValidationError:
        if f'"{MARKER}"' in text:
            raise CodecError(
                CodecFailure.NOT_CONFIGURED,
                "a stored reply is encoded and this participant has no codec configured",
            ) from None
        raise

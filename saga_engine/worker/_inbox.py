"""The saga inbox's records, applied to the engine.

A fetched batch is decoded (a record no one can read is dead-lettered), each record
turned into the engine's input (``Start``, ``Deliver``), and those applied as one batch
through the engine's one path. A saga with a record the child links or a reload handle
(a child's start, an undo, a reload notice) has all its records of the batch applied one
at a time, in partition order, through the same path (each a batch of one).

An input that did not go through is answered by its outcome: a saga error the message
caused makes it a poison message (dead-lettered with its reason, never retried); a
transient error is retried with back-off (the input, applied again, is deduplicated); a
write that kept conflicting with another engine's is dead-lettered while the partition is
still ours. Past one database, an input whose saga's shard does not answer holds its
partition: the batch's other partitions go on, and that one is read again from that record
a moment later (``held``), so that one shard down does not stop every other shard's sagas.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from aiokafka import TopicPartition

from saga_engine.core.history._blobref import resolving
from saga_engine.core.history._codec import CodecChain
from saga_engine.core.history._decision import Decision, DropReason
from saga_engine.kernel._dead_letter_reason import dead_letter_detail, dead_letter_reason
from saga_engine.kernel._errors import (
    ConcurrencyError,
    PoisonMessage,
    PoisonReason,
    ShardUnavailable,
    StaleShardMap,
)
from saga_engine.kernel._retry import OUTAGE, is_transient
from saga_engine.kernel._settings import Settings
from saga_engine.runner._children import ChildLinks
from saga_engine.runner._engine import Engine
from saga_engine.runner._path_inputs import Deliver, Input, InputOutcome, Start
from saga_engine.transport._bus import DeadLetterPublisher
from saga_engine.transport._dead_letter_sending import publish_dead_letter
from saga_engine.transport._record_blobs import RecordBlobs, fetch_record_blobs
from saga_engine.transport._timings import reply_timings
from saga_engine.transport._wire import (
    CancelBody,
    Envelope,
    Headers,
    MessageType,
    ReloadBody,
    ReplyBody,
    SignalBody,
    UndoBody,
    decode,
    start_request,
)

log = logging.getLogger("saga_engine.worker")

_Record = tuple[TopicPartition, Any, Envelope]


class Inbox:
    def __init__(
        self,
        *,
        engine: Engine,
        children: ChildLinks,
        settings: Settings,
        codec: CodecChain | None,
        dead: DeadLetterPublisher,
        blobs: RecordBlobs | None = None,
        instance_id: str,
        owned: Callable[[], set[TopicPartition]],
        running: Callable[[], bool],
        on_dead_letter: Callable[[str], None],
    ) -> None:
        self._engine = engine
        self._children = children
        self._settings = settings
        self._codec = codec
        #: Where a reply by reference's blob is read (None: records are read inline).
        self._blobs = blobs
        self._dead = dead
        self._instance_id = instance_id
        self._owned = owned
        self._running = running
        self._on_dead_letter = on_dead_letter
        #: A record of the batch in hand was given up (stopping, or no longer ours).
        self._abandoned = False
        #: The partitions of the batch in hand whose records wait for their shard: the
        #: offset of the first record not applied (read again from there).
        self._held: dict[TopicPartition, int] = {}
        #: Partitions held by an earlier batch, until one of theirs goes through.
        self._waiting: set[TopicPartition] = set()

    @property
    def held(self) -> dict[TopicPartition, int]:
        """The last batch's partitions whose shard did not answer, each with the offset
        to read it again from (its offset to commit, too)."""
        return dict(self._held)

    async def process(self, batch: dict[TopicPartition, list[Any]]) -> dict[TopicPartition, int]:
        """Applies a fetched batch. Returns the offsets to commit once it is durable: none
        when a record of it was given up (stopping in an outage), so that the next owner
        reads the batch again."""
        self._abandoned = False
        self._held = {}
        offsets: dict[TopicPartition, int] = {}
        readable: list[_Record] = []
        owned = self._owned()
        for tp, records in batch.items():
            if tp not in owned:
                continue
            offsets[tp] = records[-1].offset + 1
            for record in records:
                envelope = await self._read(record)
                if envelope is not None:
                    readable.append((tp, record, envelope))
        batched, single = self._split(readable)
        loop = asyncio.get_running_loop()
        # Tasks are created in record order and take the saga's lock before their first
        # await, so one saga's messages are applied in partition order.
        tasks = [loop.create_task(self._handle(*one)) for one in single]
        if batched:
            outcomes = await self._engine.apply([item for _, item in batched])
            for (one, _), outcome in zip(batched, outcomes, strict=True):
                if outcome.error is not None or _unknown_command(one[2], outcome.decision):
                    await self._handle(*one, first=outcome)
        if tasks:
            await asyncio.gather(*tasks)
        offsets.update(self._held)
        self._note_waiting(offsets)
        return {} if self._abandoned else offsets

    def _note_waiting(self, offsets: dict[TopicPartition, int]) -> None:
        for tp in set(offsets) & self._waiting - set(self._held):
            self._waiting.discard(tp)
            log.info("partition %d goes on: its shard answers again", tp.partition)
        self._waiting |= set(self._held)

    def _hold(self, tp: TopicPartition, offset: int, exc: ShardUnavailable | StaleShardMap) -> None:
        """The record at ``offset`` of ``tp`` waits for its shard (down, or its range
        moving to another), and so does every later record of ``tp`` (one partition, one
        shard): read again from it."""
        if tp not in self._held and tp not in self._waiting:
            log.warning(
                "partition %d waits (%s); its records are read again in a moment, "
                "the other partitions go on",
                tp.partition,
                exc,
            )
        self._held[tp] = min(offset, self._held.get(tp, offset))

    async def _read(self, record: Any) -> Envelope | None:
        headers = list(record.headers or [])
        try:
            if self._blobs is None:  # no records by reference: the path as it was
                return self._decode(record, headers)
            # A record by reference: its blob first (a reference that does not verify is
            # dead-lettered as blob_tampered before anything is fetched).
            blobs = await self._blobs_of(record.value, headers)
            if blobs is None:
                return None
            with resolving(blobs):
                return self._decode(record, headers)
        except Exception as exc:  # a bug in reading must not stop the inbox either
            reason = dead_letter_reason(exc) or PoisonReason.ENGINE_ERROR
            if reason is PoisonReason.ENGINE_ERROR:
                log.exception("unexpected error reading a message; dead-lettering it")
            await self._dead_letter(record, reason, dead_letter_detail(exc, reason))
        return None

    def _decode(self, record: Any, headers: Headers) -> Envelope:
        return decode(
            record.key,
            record.value,
            headers,
            max_bytes=self._settings.kafka.max_message_bytes,
            codec=self._codec,
        )

    async def _blobs_of(self, value: bytes | None, headers: Headers) -> dict[str, bytes] | None:
        """The blob a record by reference names; an outage of the blob store is waited
        out while the inbox runs (the record is not the one at fault). None: the inbox
        stopped meanwhile, the record is given up (its batch read again by the next
        owner)."""
        backoff = OUTAGE.backoff()
        while True:
            try:
                return await fetch_record_blobs(value, headers, self._codec, self._blobs)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if not self._running():
                    self._abandoned = True
                    return None
                delay = backoff.next_delay()
                log.warning("reading a record's blob failed (%r); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)  # a back-off, not a synchronisation

    def _split(self, readable: list[_Record]) -> tuple[list[tuple[_Record, Input]], list[_Record]]:
        """The records taken as one batch (with their inputs), and those applied one at
        a time: every record of a saga that has one the batch does not take."""
        batched: list[tuple[_Record, Input]] = []
        single: list[_Record] = []
        singles: set[str] = set()
        for one in readable:
            saga_id = one[2].saga_id
            item = None if saga_id in singles else self._input_or_none(one[2])
            if item is None:
                singles.add(saga_id)
                single.append(one)
            else:
                batched.append((one, item))
        if singles:
            # Handed to the one-at-a-time order whole, with the records of the same saga
            # already taken into the batch (a later record made the saga single).
            moved = [one for one, _ in batched if one[2].saga_id in singles]
            if moved:
                batched = [(one, i) for one, i in batched if one[2].saga_id not in singles]
                single = sorted([*single, *moved], key=lambda one: one[1].offset)
        return batched, single

    def _input_or_none(self, env: Envelope) -> Input | None:
        try:
            return self._input(env)
        except Exception:
            return None  # applied alone, which raises it again and says what it means

    def _input(self, env: Envelope) -> Input | None:
        """The engine's input for ``env``; None for a message the child links or a
        reload handle."""
        engine = self._engine
        kind = env.message_type
        if kind is MessageType.REPLY:
            reply: ReplyBody = env.body_as(ReplyBody)
            return Deliver(
                env.saga_id,
                engine.reply_input(
                    env.command_id,
                    reply.outcome,
                    reply.payload,
                    reply.error,
                    sender=env.causation_id,
                    timings=reply_timings(env),
                ),
            )
        if kind is MessageType.SIGNAL:
            sig: SignalBody = env.body_as(SignalBody)
            return Deliver(
                env.saga_id,
                engine.signal_input(
                    sig.name,
                    sig.payload,
                    signal_id=sig.signal_id,
                    principal=sig.principal,
                    reason=sig.reason,
                ),
            )
        if kind is MessageType.CANCEL:
            cancel: CancelBody = env.body_as(CancelBody)
            return Deliver(
                env.saga_id, engine.cancel_input(cancel.reason, principal=cancel.principal)
            )
        if kind is not MessageType.START:
            return None
        request = start_request(env)
        if request.parent is not None:
            return None  # a child's start: the child links check it against its parent
        prepared = engine.prepare(request)
        return Start(prepared.saga_id, prepared)

    async def _handle(
        self, tp: TopicPartition, record: Any, envelope: Envelope, first: InputOutcome | None = None
    ) -> None:
        """Applies one record (``first``: the outcome of its first application, in a
        batch), until it is applied, dead-lettered or given up."""
        backoff = OUTAGE.backoff()
        while True:
            if self._held.get(tp, record.offset) < record.offset:
                return  # an earlier record of its partition waits for the shard: so does it
            try:
                if first is not None:
                    outcome, first = first, None
                    _settled(envelope, outcome)
                else:
                    await self._apply(envelope)
                return
            except ConcurrencyError as exc:
                if not self._running() or tp not in self._owned():
                    log.info("stale owner for a message of partition %d: %s", tp.partition, exc)
                    return
                # Still ours, and the engine's own retries (rebuilt from history each
                # time) kept losing to another writer: park the message rather than stall
                # the partition.
                await self._dead_letter(
                    record,
                    PoisonReason.ENGINE_ERROR,
                    f"kept conflicting with another writer: {exc}",
                )
                return
            except Exception as exc:
                # A saga error the message caused makes it a poison message; a bug must
                # not stop the inbox either: both are dead-lettered, never retried.
                reason = dead_letter_reason(exc, message_type=envelope.message_type.value)
                if reason is not None:
                    if reason is PoisonReason.ENGINE_ERROR:
                        log.exception("unexpected error processing a message; dead-lettering it")
                    await self._dead_letter(record, reason, dead_letter_detail(exc, reason))
                    return
                if not self._running() or tp not in self._owned():
                    if not self._running():
                        # Not applied: its batch's offsets must not be committed (the
                        # offsets of a partition no longer ours are not committed anyway).
                        self._abandoned = True
                    return
                if isinstance(exc, ShardUnavailable | StaleShardMap):
                    self._hold(tp, record.offset, exc)
                    return
                delay = backoff.next_delay()
                log.warning("transient failure (%s); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)

    async def _apply(self, env: Envelope) -> None:
        decision = await self._route(env)
        if _unknown_command(env, decision):
            raise _unknown(env)

    async def _route(self, env: Envelope) -> Decision | None:
        item = self._input(env)
        if item is not None:
            (outcome,) = await self._engine.apply([item])
            return outcome.result()
        kind = env.message_type
        if kind is MessageType.START:
            await self._children.start_child(start_request(env))
        elif kind is MessageType.UNDO:
            undo: UndoBody = env.body_as(UndoBody)
            await self._children.undo_child(
                env.saga_id, env.command_id, undo.parent_id, undo.reason
            )
        elif kind is MessageType.RELOAD:
            env.body_as(ReloadBody)  # validated like every body
            await self._engine.reload(env.saga_id)
        else:
            raise PoisonMessage(
                PoisonReason.UNKNOWN_TYPE, f"{kind.value} does not belong in the saga inbox"
            )
        return None

    async def _dead_letter(self, record: Any, reason: PoisonReason, detail: str) -> None:
        await publish_dead_letter(
            self._dead,
            record,
            reason=reason.value,
            detail=detail,
            consumer=self._instance_id,
            running=self._running,
        )
        self._on_dead_letter(reason.value)


def _settled(env: Envelope, outcome: InputOutcome) -> None:
    """Raises what ``outcome`` says went wrong."""
    if outcome.error is not None:
        raise outcome.error
    if _unknown_command(env, outcome.decision):
        raise _unknown(env)


def _unknown_command(env: Envelope, decision: Decision | None) -> bool:
    return (
        env.message_type is MessageType.REPLY
        and decision is not None
        and decision.dropped is DropReason.UNKNOWN_COMMAND
    )


def _unknown(env: Envelope) -> PoisonMessage:
    return PoisonMessage(
        PoisonReason.UNKNOWN_COMMAND,
        f"saga {env.saga_id} never issued command {env.command_id!r}",
    )

"""From a consumed record to a command ready to be answered: :class:`Item` and
:class:`Reader`.

Reading needs no transaction. A record is decoded and its headers are checked; one that
cannot be answered at all is dead-lettered. For the others, either the handler and the
validated command model are found, or the reply the command gets without its handler is
decided: a failure for a body Postgres cannot store or that does not validate (both also
dead-lettered, with their reasons), and for a command type with no handler. An outage
while reading (Kafka away when a reply topic is created) is waited out; any other
failure dead-letters the record as ``engine_error``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from aiokafka import TopicPartition
from pydantic import BaseModel, ValidationError

from saga_engine.core.history._blobref import resolving
from saga_engine.kernel._dead_letter_reason import dead_letter_detail, dead_letter_reason
from saga_engine.kernel._errors import InvalidPayload, PoisonMessage, PoisonReason, UnstorableValue
from saga_engine.kernel._input_types import text_problem
from saga_engine.kernel._retry import OUTAGE, is_transient
from saga_engine.kernel._serde import unstorable
from saga_engine.participant._context import Abandoned, ParticipantContext, log
from saga_engine.participant._handler import (
    HandlerAnswer,
    HandlerSpec,
    invalid_body,
    invalid_body_reply,
    refusal_reply,
    unknown_command_reply,
    unstorable_body,
)
from saga_engine.participant._sql import Outgoing
from saga_engine.transport._record_blobs import fetch_record_blobs
from saga_engine.transport._wire import Envelope, MessageType, ReplyBody, decode

#: A topic name Kafka accepts (a reply_to header is checked against it before use).
TOPIC_NAME: Final = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
#: The headers of a command's ids, which go into the deduplication table's text columns.
_ID_HEADERS: Final = ("ce_commandid", "ce_sagaid", "ce_step", "ce_subject", "ce_compensates")
#: Longest command id the deduplication table accepts (its CHECK constraint).
MAX_COMMAND_ID: Final = 200


@dataclass(slots=True)
class Item:
    """One record of a batch and what became of it."""

    tp: TopicPartition
    record: Any
    #: When the batch holding it was read (seconds since the epoch): ``ce_receivedtime``.
    received: float = 0.0
    command: Envelope | None = None
    topic: str = ""
    handler: HandlerSpec | None = None
    model: BaseModel | None = None
    #: A reply decided without the handler (no handler, an invalid body, a handler that
    #: kept raising), and its counter.
    fixed: ReplyBody | None = None
    counter: str = ""
    #: The handler's attempt (``Transaction.attempt``): it grows each time it raised.
    attempt: int = 1
    #: Its handler refused (Rejected) or answered Retryable in a pass that was rolled
    #: back: the answer is recorded without running the handler again.
    refused: HandlerAnswer | None = None
    outgoing: Outgoing | None = None
    duplicate: bool = False
    #: The counter of the handler's answer recorded for it ("rejected", "retryable").
    answered: str = ""
    #: Answered by an earlier item of the batch with the same command id.
    same_as: Item | None = None
    #: Its batch handler raised in a group of several: it is called alone until the
    #: command to blame is found.
    solo: bool = False
    #: Its record needs nothing more (dead-lettered, or answered).
    done: bool = False
    #: When its handler started and ended (seconds since the epoch) and its CPU time
    #: (seconds), in the pass that ran it: the reply's timing headers.
    handler_times: tuple[float, float, float] | None = None

    @property
    def alone(self) -> bool:
        """Its handler asks for another isolation level than the batch's READ COMMITTED:
        one transaction has one, so it runs in a transaction of its own."""
        return self.handler is not None and self.handler.isolation != "read_committed"


class Reader:
    """Reads the records of a batch (see the module docstring)."""

    def __init__(self, ctx: ParticipantContext) -> None:
        self._ctx = ctx

    async def prepare(self, items: list[Item]) -> list[Item]:
        """Reads every item's record. Returns the items still to answer, in order (the
        others are done: dead-lettered). Raises Abandoned if the participant stops while
        an outage is waited out."""
        todo: list[Item] = []
        for item in items:
            try:
                await self._read(item)
            except Abandoned:
                raise
            except Exception as exc:
                await self._recover(item, exc)
            if not item.done:
                todo.append(item)
        return todo

    async def _recover(self, item: Item, exc: Exception) -> None:
        """Reads ``item`` again after each outage, until it can be read or the participant
        stops; dead-letters it for any other failure."""
        backoff = OUTAGE.backoff()
        while is_transient(exc):
            delay = backoff.next_delay()
            log.warning("transient failure (%r); retrying in %.2fs", exc, delay)
            await self._ctx.pause(delay)
            try:
                await self._read(item)
                return
            except Abandoned:
                raise
            except Exception as again:
                exc = again
        reason = dead_letter_reason(exc)
        if reason is None or reason is PoisonReason.ENGINE_ERROR:
            await self._ctx.engine_error(item.record, exc)
        else:
            await self._ctx.dead_letter(item.record, reason.value, dead_letter_detail(exc, reason))
        item.done = True

    async def _read(self, item: Item) -> None:
        ctx = self._ctx
        record = item.record
        # A command by reference: its blob first. A reference that does not verify, or
        # a blob missing or altered, is dead-lettered (``_recover``), never answered.
        blobs: dict[str, bytes] = {}
        if ctx.blobs is not None:
            headers = list(record.headers or [])
            blobs = await fetch_record_blobs(record.value, headers, ctx.codec, ctx.blobs)
        try:
            with resolving(blobs):
                command, refused = self._decode(record)
        except PoisonMessage as poison:
            await ctx.dead_letter(item.record, poison.reason.value, dead_letter_detail(poison))
            item.done = True
            return
        item.command = command
        item.topic = await ctx.reply_topic(command)
        dead = self._classify(item, command, refused)
        if dead is not None:
            await ctx.dead_letter(item.record, *dead)

    def _classify(
        self, item: Item, command: Envelope, refused: InvalidPayload | None
    ) -> tuple[str, str] | None:
        """Finds the handler and the model, or decides the reply given without them.
        Returns the reason and detail the record is dead-lettered with, if it is."""
        ctx = self._ctx
        item.handler, item.model, item.fixed = None, None, None
        invalid = refused or unstorable_body(command)
        if invalid is not None:
            item.fixed, item.counter = refusal_reply(invalid), "unstorable"
            return PoisonReason.UNSTORABLE_VALUE.value, str(invalid)
        handler = ctx.handlers.get(command.subject)
        if handler is None:
            item.fixed = unknown_command_reply(ctx.name, command, list(ctx.handlers))
            item.counter = "unknown_command"
            return None
        try:
            item.model = handler.validate(command.body)
        except ValidationError as exc:
            item.fixed, item.counter = invalid_body_reply(command, exc), "invalid_body"
            return PoisonReason.INVALID_BODY.value, invalid_body(command, handler.model, exc)
        item.handler = handler
        return None

    def _decode(self, record: Any) -> tuple[Envelope, InvalidPayload | None]:
        """The record's command and, when only its body was refused (too deep to read),
        that refusal: the command is answered with it, like a body that cannot be
        stored. PoisonMessage for a record that cannot be answered at all."""
        try:
            command = decode(
                record.key,
                record.value,
                list(record.headers or []),
                max_bytes=self._ctx.settings.kafka.max_message_bytes,
                codec=self._ctx.codec,
            )
        except PoisonMessage as poison:
            # With its ``envelope`` set, the body alone was refused: its headers are
            # checked like any command's, and if they pass it is answered.
            if not isinstance(poison.envelope, Envelope):
                raise
            _check_headers(poison.envelope)
            if poison.body_error is None:
                raise
            return poison.envelope, poison.body_error
        _check_headers(command)
        return command, None


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
    values = (
        command.command_id,
        command.saga_id,
        command.step,
        command.subject,
        command.compensates,
    )
    if text_problem("".join(values)) is None:
        return  # each is storable if they are together (the common case: one look)
    problems = unstorable(dict(zip(_ID_HEADERS, values, strict=True)))
    if problems:
        # These go into the deduplication table's text columns: with one that cannot be
        # stored, no answer can be recorded, so none is sent.
        raise PoisonMessage(
            PoisonReason.UNSTORABLE_VALUE, str(UnstorableValue("the command's headers", problems))
        )

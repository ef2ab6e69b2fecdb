"""The record each engine command is on the broker (pure but for the clock it stamps).

The Kafka sender publishes these records; the engine measures them with the same code
when a saga's step issues its command (the one size rule, ``check_message_size``), so a
command is measured exactly as it would be sent: headers and sealed value included. A
command is measured only when a cheap upper bound of its size (``bound``: its body's JSON
and its text, without building the record) does not fit; the bound never undercounts
(``tests/internal/property/test_record_bound.py``), so no refusal changes.

A participant's command is stamped ``ce_senttime`` when its record is made, which is
when the sender publishes it: flow control holds a command *before* this sender, so the
stamp is when it left the engine, after any hold (PROTOCOL.md 7.4a). The stamp always
has the same length, so the size measured when the step issued it is the size sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from operator import itemgetter

import orjson

from saga_engine.core.history._codec import CodecChain
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.kernel._ids import uuid4_text
from saga_engine.transport._child_wire import ENGINE_PARTICIPANTS, engine_envelope
from saga_engine.transport._timings import wire_time, wire_time_bytes
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import (
    FIXED_HEADERS,
    HEADERS,
    SCHEMA_VERSION,
    Headers,
    MessageType,
    encode,
    fixed_headers_size,
    record_size,
    seal_value,
)

#: ``ce_senttime`` when a record is only measured: a time's length (``wire_time`` always
#: writes microseconds), so the size measured is the size sent. ``ce_time`` too.
SENT_TIME_PLACEHOLDER = wire_time(0.0)
_TIME_PLACEHOLDER = SENT_TIME_PLACEHOLDER.encode()
#: ``ce_id`` when a record is only measured: a UUID's length.
_ID_PLACEHOLDER = b"00000000-0000-4000-8000-000000000000"
#: The header names of a command's fields (``HEADERS``).
(
    _ID,
    _TYPE,
    _SOURCE,
    _SUBJECT,
    _TIME,
    _SAGA_ID,
    _SAGA_TYPE,
    _COMMAND_ID,
    _STEP,
    _CORRELATION_ID,
    _CAUSATION_ID,
    _REPLY_TO,
    _SCHEMA_VERSION,
    _COMPENSATION,
    _COMPENSATES,
    _TRACEPARENT,
    _TRACESTATE,
    _SENT_TIME,
) = (
    HEADERS[name]
    for name in (
        "id",
        "message_type",
        "source",
        "subject",
        "time",
        "saga_id",
        "saga_type",
        "command_id",
        "step",
        "correlation_id",
        "causation_id",
        "reply_to",
        "schema_version",
        "compensation",
        "compensates",
        "traceparent",
        "tracestate",
        "sent_time",
    )
)
_COMMAND_TYPE = MessageType.COMMAND.value.encode()
_SCHEMA = SCHEMA_VERSION.encode()
_WRITTEN = itemgetter(1)

#: What a command record's headers hold besides its text (``bound``): every header's
#: name, the fixed headers, and room for the values whose length the engine sets (an id
#: and a time ``encode_fields`` makes, the message type, the schema version, ``true``,
#: ``ce_senttime``): 256 bytes where they take about 120.
_HEADER_ROOM = fixed_headers_size() + sum(len(name) for name in HEADERS.values()) + 256


class CommandRecords:
    """The record each engine command is on the broker: its topic, key, value and
    headers. ``size`` is what the one size rule measures (``check_message_size``)."""

    def __init__(
        self,
        topics: Topics,
        source: str,
        codec: CodecChain | None = None,
        clock: Callable[[], float] = time.time,
        *,
        by_reference: bool = False,
    ) -> None:
        self._topics = topics
        self._source = source
        self._codec = codec
        #: The wall clock ``ce_senttime`` reads (seconds since the epoch).
        self._clock = clock
        #: Commands go by reference when large (a ``ref`` codec and a place to keep its
        #: blobs): measured as sent, by reference; else inline.
        self._by_reference = by_reference and codec is not None and codec.reference is not None
        #: ``ce_time`` and ``ce_senttime`` from one reading: the clock is the wall clock.
        self._wall_clock = clock is time.time
        self._source_bytes = source.encode()
        self._reply_to = topics.inbox.encode()
        #: The text every command's record has whatever the command (``bound``).
        self._fixed_text = len(source) + len(topics.inbox)

    def record(
        self,
        command: OutboundCommand,
        *,
        measuring: bool = False,
        blobs: dict[str, bytes] | None = None,
    ) -> tuple[str, bytes, bytes, Headers]:
        """The command's record: topic, key, value and headers. ``measuring``: for its
        size only (its ``ce_senttime`` is a placeholder of the same length). A
        participant's command whose payload the chain's ``ref`` codec takes goes by
        reference, its blob put in ``blobs`` (to keep before the record is sent,
        ``_record_blobs``); measured, it is measured as it will be sent."""
        if command.participant in ENGINE_PARTICIPANTS:
            # A child saga's start or undo, or a child's end for its parent: engines
            # answer these themselves, through the saga inbox (see _children).
            envelope = engine_envelope(command, self._source)
            return (self._topics.inbox, *encode(envelope, self._codec))
        topic = self._topics.commands(command.participant)
        if measuring:
            new_id, now = _ID_PLACEHOLDER, _TIME_PLACEHOLDER
            sent = now
        else:
            new_id, sent = uuid4_text().encode(), wire_time_bytes(self._clock())
            # ce_time: when the record was made, which is when it is sent (one reading
            # of the wall clock for both)
            now = sent if self._wall_clock else wire_time_bytes(time.time())
        saga_id, headers = self._headers(command, new_id, now, sent)
        if not self._by_reference:
            blobs = None
        elif measuring and blobs is None:
            blobs = {}
        value = orjson.dumps(command.payload, option=orjson.OPT_UTC_Z)
        if self._codec is not None:
            value, headers = seal_value(value, headers, self._codec, blobs)
        return topic, saga_id, value, headers

    def size(self, command: OutboundCommand) -> int:
        """The bytes of ``command``'s record: its value and every header name and value."""
        _, _, value, headers = self.record(command, measuring=True)
        return record_size(value, headers)

    def bound(self, command: OutboundCommand) -> int | None:
        """At least ``size(command)``, computed without building the record (no header
        list, no envelope defaults): the body's JSON bytes, the headers' room, and four
        bytes for every character of the command's text (UTF-8 takes at most four). The
        size rule asks for the exact size only when this bound does not fit. None when
        there is no cheap bound: a codec seals the body (a compression, an encryption or
        a reference changes its length), or the command goes to an engine."""
        if self._codec is not None or command.participant in ENGINE_PARTICIPANTS:
            return None
        text = (
            self._fixed_text
            + len(command.command_type)
            + 2 * len(command.saga_id)  # ce_sagaid and ce_correlationid
            + len(command.saga_type)
            + 2 * len(command.command_id)  # ce_commandid and ce_causationid
            + len(command.step)
        )
        if command.compensates:
            text += sum(map(len, command.compensates)) + len(command.compensates)  # commas
        trace = command.trace_context
        if trace:
            text += len(trace.get("traceparent", "")) + len(trace.get("tracestate", ""))
        return len(orjson.dumps(command.payload, option=orjson.OPT_UTC_Z)) + _HEADER_ROOM + 4 * text

    def _headers(
        self, command: OutboundCommand, new_id: bytes, now: bytes, sent: bytes
    ) -> tuple[bytes, Headers]:
        """The command's key and headers, from the decision (its values are the engine's
        own, checked when it decided: no ``Envelope`` is validated for them): what
        ``encode_fields`` writes of them (``HEADERS``' order, an empty value left out),
        each written once (the saga id is the key and ``ce_correlationid``)."""
        trace = command.trace_context
        saga_id = command.saga_id.encode()
        command_id = command.command_id.encode()
        fields = (
            (_ID, new_id),
            (_TYPE, _COMMAND_TYPE),
            (_SOURCE, self._source_bytes),
            (_SUBJECT, command.command_type.encode()),
            (_TIME, now),
            (_SAGA_ID, saga_id),
            (_SAGA_TYPE, command.saga_type.encode()),
            (_COMMAND_ID, command_id),
            (_STEP, command.step.encode()),
            (_CORRELATION_ID, saga_id),
            (_CAUSATION_ID, command_id),
            (_REPLY_TO, self._reply_to),
            (_SCHEMA_VERSION, _SCHEMA),
            (_COMPENSATION, b"true" if command.compensation else b""),
            (_COMPENSATES, ",".join(command.compensates).encode()),
            (_TRACEPARENT, trace.get("traceparent", "").encode()),
            (_TRACESTATE, trace.get("tracestate", "").encode()),
            (_SENT_TIME, sent),
        )
        return saga_id, [*FIXED_HEADERS, *filter(_WRITTEN, fields)]

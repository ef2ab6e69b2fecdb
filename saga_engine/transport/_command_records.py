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
from typing import Any

import orjson

from saga_engine.core.history._codec import CodecChain
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.transport._child_wire import ENGINE_PARTICIPANTS, engine_envelope
from saga_engine.transport._timings import wire_time
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import (
    HEADERS,
    Headers,
    MessageType,
    encode,
    encode_fields,
    fixed_headers_size,
    record_size,
)

#: ``ce_senttime`` when a record is only measured: a time's length (``wire_time`` always
#: writes microseconds), so the size measured is the size sent.
SENT_TIME_PLACEHOLDER = wire_time(0.0)

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
        fields = self._fields(command, measuring)
        if not self._by_reference:
            blobs = None
        elif measuring and blobs is None:
            blobs = {}
        return (topic, *encode_fields(fields, command.payload, self._codec, blobs=blobs))

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

    def _fields(self, command: OutboundCommand, measuring: bool = False) -> dict[str, Any]:
        """The command's envelope fields, from the decision (its values are the engine's
        own, checked when it decided: no ``Envelope`` is validated for them)."""
        trace = command.trace_context
        return {
            "message_type": MessageType.COMMAND,
            "source": self._source,
            "subject": command.command_type,
            "saga_id": command.saga_id,
            "saga_type": command.saga_type,
            "command_id": command.command_id,
            "step": command.step,
            "correlation_id": command.saga_id,
            "causation_id": command.command_id,
            "reply_to": self._topics.inbox,
            "compensation": command.compensation,
            "compensates": ",".join(command.compensates),
            "traceparent": trace.get("traceparent", ""),
            "tracestate": trace.get("tracestate", ""),
            "sent_time": SENT_TIME_PLACEHOLDER if measuring else wire_time(self._clock()),
        }

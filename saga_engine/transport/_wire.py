"""The wire format: how commands, replies, start requests, signals and cancels look on Kafka.

Messages follow the CloudEvents Kafka protocol binding in *binary* mode: the event's
attributes travel as ``ce_*`` headers, the body is the JSON value, ``content-type`` is
``application/json``. Every message is keyed by the saga id, so one saga's messages stay
in one partition, in order. W3C trace context travels in ``traceparent`` /
``tracestate`` headers, where OpenTelemetry propagators expect it.

This module is pure: it turns :class:`Envelope` objects into (key, value, headers)
and back, and says precisely why a message cannot be read (:class:`PoisonMessage`).
``proto/`` holds the JSON Schemas generated from these models.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from saga_engine.core.history._blobref import collecting
from saga_engine.core.history._codec import HEADER, MARKER, CodecChain
from saga_engine.core.history._events import ParentLink, RerunLink, TriggerOrigin
from saga_engine.core.runtime._start import StartRequest
from saga_engine.kernel._dead_letter_reason import dead_letter_reason
from saga_engine.kernel._errors import (
    CodecError,
    PayloadTooLarge,
    PoisonMessage,
    PoisonReason,
    SerializationError,
    UnstorableValue,
)
from saga_engine.kernel._ids import uuid4_text
from saga_engine.kernel._serde import JsonDict, loads, too_deep, without_input
from saga_engine.kernel._settings import check_message_size

SCHEMA_VERSION = "1"
#: The header that marks an encoded value, naming the codec chain (``zstd,aes-gcm``).
CODEC_HEADER = HEADER
#: The key of the JSON marker an encoded value is: ``{"$codec": chain, "data": base64}``.
CODEC_MARKER = MARKER
CE_SPECVERSION = "1.0"

Headers = list[tuple[str, bytes]]


class MessageType(StrEnum):
    """The ``ce_type`` of a message: what it asks or tells."""

    COMMAND = "saga.command"
    REPLY = "saga.reply"
    START = "saga.start"
    SIGNAL = "saga.signal"
    CANCEL = "saga.cancel"
    RELOAD = "saga.reload"
    UNDO = "saga.undo"


# --------------------------------------------------------------------------- bodies


class ReplyBody(BaseModel):
    """A participant's answer to a command."""

    model_config = ConfigDict(extra="forbid", title="Reply")

    outcome: Literal["success", "failure", "retryable"] = Field(
        description="success: applied; failure: refused, nothing applied; "
        "retryable: not applied, the engine may try again under a new command id"
    )
    payload: JsonDict = Field(default_factory=dict, description="the reply's data")
    error: str | None = Field(default=None, description="why it failed, for humans")


class StartBody(BaseModel):
    """A request to start a saga (the saga id is the message key)."""

    model_config = ConfigDict(extra="forbid", title="StartSaga")

    input: JsonDict = Field(description="the saga's input, validated against its input model")
    idempotency_key: str | None = Field(
        default=None,
        description="starting twice with the same key yields one saga; the saga id (the key "
        "of the message) is derived from it by the sender",
    )
    deadline_s: float | None = Field(
        default=None,
        gt=0,
        # A hundred years: further than any business deadline, and short of the dates a
        # computer cannot represent (beyond year 9999 the start could not be recorded).
        le=3_153_600_000,
        description="seconds until the saga's deadline, overriding its default (at most a "
        "hundred years)",
    )
    parent: ParentLink | None = Field(
        default=None,
        description="set by an engine starting a child saga (ctx.child): the parent saga and "
        "the command of its step; the child's end is sent as the reply to that command",
    )
    trigger: TriggerOrigin | None = Field(
        default=None,
        description="set by a trigger: the Kafka record the start was made from, recorded in "
        "the saga's history so it can be traced back to its cause",
    )
    priority: int = Field(
        default=0,
        ge=-1_000_000,
        le=1_000_000,
        description="flow control: when a limit holds commands back, a higher priority is "
        "sent first (recorded in saga_started)",
    )
    fairness_key: str | None = Field(
        default=None,
        max_length=200,
        description="flow control: commands of different keys (tenants) take turns when a "
        "limit holds them back (recorded in saga_started)",
    )
    rerun_of: RerunLink | None = Field(
        default=None,
        description="set by an operator's rerun: the saga re-run as this one, who asked and "
        "why (recorded in saga_started, for the lineage)",
    )


class SignalBody(BaseModel):
    """A signal for a running saga (``ctx.wait_signal(name)``)."""

    model_config = ConfigDict(extra="forbid", title="Signal")

    name: str = Field(min_length=1, max_length=200, description="the signal's name")
    signal_id: str = Field(
        min_length=1, max_length=200, description="deduplication key: the same id is applied once"
    )
    payload: JsonDict = Field(default_factory=dict, description="the signal's data")
    principal: str = Field(
        default="system", max_length=200, description="who sent it, recorded in the history"
    )
    reason: str = Field(default="", max_length=2000, description="why, recorded in the history")


class CancelBody(BaseModel):
    """Cancels a running saga; its owed compensations run."""

    model_config = ConfigDict(extra="forbid", title="Cancel")

    reason: str = Field(max_length=2000, description="why, recorded in the saga's history")
    principal: str = Field(default="system", description="who asked, recorded in the history")


class ReloadBody(BaseModel):
    """Tells the saga's owner that another engine changed its history (an operator acted
    on it there): the owner rebuilds it from history, re-sends what is in flight and
    re-arms its timers. Engines send it to each other; clients and participants never."""

    model_config = ConfigDict(extra="forbid", title="Reload")

    changed_by: str = Field(
        default="", max_length=200, description="the engine instance that changed it"
    )


class UndoBody(BaseModel):
    """A parent saga compensates: its child (the saga id, the key) undoes what it did. The
    child's end is sent as the reply to ``ce_commandid`` (the parent's compensation).
    Engines send it to each other; clients and participants never."""

    model_config = ConfigDict(extra="forbid", title="Undo")

    parent_id: str = Field(min_length=1, max_length=200, description="the parent saga's id")
    reason: str = Field(default="", max_length=2000, description="why, recorded in the history")


BODY_MODELS: dict[MessageType, type[BaseModel] | None] = {
    MessageType.COMMAND: None,  # the command's own payload, defined by the saga's author
    MessageType.REPLY: ReplyBody,
    MessageType.START: StartBody,
    MessageType.SIGNAL: SignalBody,
    MessageType.CANCEL: CancelBody,
    MessageType.RELOAD: ReloadBody,
    MessageType.UNDO: UndoBody,
}


# --------------------------------------------------------------------------- envelope


class Envelope(BaseModel):
    """One message, as its headers and body. Header names are in ``HEADERS``."""

    model_config = ConfigDict(frozen=True, extra="forbid", title="Envelope")

    id: str = Field(
        default_factory=lambda: str(uuid.uuid4()), description="ce_id: unique per message"
    )
    message_type: MessageType = Field(description="ce_type")
    source: str = Field(
        description="ce_source: who sent it, e.g. /saga-engine or /participants/payments"
    )
    subject: str = Field(
        default="", description="ce_subject: the command type, signal name or saga type"
    )
    time: datetime = Field(default_factory=lambda: datetime.now(UTC), description="ce_time")
    saga_id: str = Field(min_length=1, max_length=200, description="ce_sagaid; also the key")
    saga_type: str = Field(default="", description="ce_sagatype")
    command_id: str = Field(
        default="", description="ce_commandid: the idempotency key of a command and its reply"
    )
    step: str = Field(default="", description="ce_step: the saga step a command belongs to")
    correlation_id: str = Field(default="", description="ce_correlationid: the saga id")
    causation_id: str = Field(default="", description="ce_causationid: the message this answers")
    reply_to: str = Field(default="", description="ce_replyto: topic for the reply")
    schema_version: str = Field(default=SCHEMA_VERSION, description="ce_schemaversion")
    compensation: bool = Field(default=False, description="ce_compensation: a compensating command")
    compensates: str = Field(
        default="",
        description="ce_compensates: on a compensation, the comma-separated forward command "
        "ids it undoes; a participant records them as refused, so a forward command arriving "
        "after its compensation is never applied",
    )
    traceparent: str = Field(default="", description="W3C traceparent header")
    tracestate: str = Field(default="", description="W3C tracestate header")
    # The timing headers (PROTOCOL.md 7.4a): optional, kept as the text that came (a
    # value that is not well-formed is ignored by ``reply_timings``, never refused).
    sent_time: str = Field(
        default="",
        description="ce_senttime: on a command, when it left the engine (after any hold by "
        "flow control); a reply copies it from its command",
    )
    received_time: str = Field(
        default="", description="ce_receivedtime: on a reply, when the participant read the command"
    )
    handler_start_time: str = Field(
        default="", description="ce_handlerstarttime: on a reply, when its handler started"
    )
    handler_end_time: str = Field(
        default="", description="ce_handlerendtime: on a reply, when its handler ended"
    )
    commit_time: str = Field(
        default="",
        description="ce_committime: on a reply, when the transaction that recorded it committed",
    )
    handler_cpu_ms: str = Field(
        default="",
        description="ce_handlercpums: on a reply, the CPU time its handler used, in "
        "milliseconds (a decimal number)",
    )
    body: Any = Field(default_factory=dict, description="the JSON body (the Kafka value)")

    def body_as(self, model: type[BaseModel]) -> Any:
        try:
            return model.model_validate(self.body)
        except ValidationError as exc:
            raise PoisonMessage(
                PoisonReason.INVALID_BODY,
                f"{self.message_type.value} body is not a valid {model.__name__}: "
                f"{without_input(exc)}",
            ) from exc


#: Envelope field -> Kafka header name (CloudEvents binary mode; extensions are lowercase).
HEADERS: dict[str, str] = {
    "id": "ce_id",
    "message_type": "ce_type",
    "source": "ce_source",
    "subject": "ce_subject",
    "time": "ce_time",
    "saga_id": "ce_sagaid",
    "saga_type": "ce_sagatype",
    "command_id": "ce_commandid",
    "step": "ce_step",
    "correlation_id": "ce_correlationid",
    "causation_id": "ce_causationid",
    "reply_to": "ce_replyto",
    "schema_version": "ce_schemaversion",
    "compensation": "ce_compensation",
    "compensates": "ce_compensates",
    "traceparent": "traceparent",
    "tracestate": "tracestate",
    "sent_time": "ce_senttime",
    "received_time": "ce_receivedtime",
    "handler_start_time": "ce_handlerstarttime",
    "handler_end_time": "ce_handlerendtime",
    "commit_time": "ce_committime",
    "handler_cpu_ms": "ce_handlercpums",
}
#: The timing headers (PROTOCOL.md 7.4a), by Envelope field: the times, then the CPU.
TIMING_TIMES = (
    "sent_time",
    "received_time",
    "handler_start_time",
    "handler_end_time",
    "commit_time",
)
TIMING_HEADERS: dict[str, str] = {f: HEADERS[f] for f in (*TIMING_TIMES, "handler_cpu_ms")}
REQUIRED_HEADERS = ("ce_id", "ce_type", "ce_source", "ce_sagaid", "ce_schemaversion")


_HEADER_ITEMS = tuple(HEADERS.items())
#: Each field's default, as the envelope has it (the id and the time, made per message,
#: have none here).
_DEFAULTS: dict[str, Any] = {
    name: field.default
    for name, field in Envelope.model_fields.items()
    if field.default_factory is None and not field.is_required()
}
#: The value of each message type's ``ce_type`` header.
_TYPE_BYTES: dict[MessageType, bytes] = {t: t.value.encode() for t in MessageType}
#: The headers every record ``encode_fields`` writes carries first, whatever its fields.
FIXED_HEADERS: tuple[tuple[str, bytes], ...] = (
    ("ce_specversion", CE_SPECVERSION.encode()),
    ("content-type", b"application/json"),
)


def _new_id() -> bytes:
    """``ce_id``: a new random UUID."""
    return uuid4_text().encode()


def _time_text(value: datetime) -> bytes:
    """A time field's header: RFC 3339, UTC written ``Z``."""
    return value.isoformat().replace("+00:00", "Z").encode()


def _now_text() -> bytes:
    """``ce_time`` when it is left out: now. (The engine and the kit give it, written as
    ``_timings`` writes every time on the wire, which imports this module.)"""
    return _time_text(datetime.now(UTC))


#: What ``encode_fields`` writes for a field left out whose header is not empty by
#: default: a new ``id``, ``time`` now, the envelope's own default (the schema version).
_MADE: dict[str, Callable[[], bytes]] = {"id": _new_id, "time": _now_text}
for _name, _default in _DEFAULTS.items():
    if isinstance(_default, str) and _default:
        _MADE[_name] = itertools.repeat(_default.encode()).__next__
    elif _default:  # a default ``encode_fields`` would write: teach it here first
        raise AssertionError(f"encode_fields cannot write {_name}'s default")
#: Each header ``encode_fields`` writes, in ``HEADERS`` order: the field it reads, or
#: what makes the header of a field left out. By the fields' names as given.
_Plan = tuple[tuple[str, "str | Callable[[], bytes]"], ...]
_PLANS: dict[tuple[str, ...], _Plan] = {}
_PLANS_MAX = 64


def _plan(names: tuple[str, ...]) -> _Plan:
    """The plan of a message given ``names`` (made once per set of names)."""
    given = frozenset(names)
    plan = tuple(
        (header, field_name if field_name in given else _MADE[field_name])
        for field_name, header in _HEADER_ITEMS
        if field_name in given or field_name in _MADE
    )
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[names] = plan
    return plan


def encode(
    envelope: Envelope, codec: CodecChain | None = None, *, blobs: dict[str, bytes] | None = None
) -> tuple[bytes, bytes, Headers]:
    """The Kafka key, value and headers of an envelope; with a codec, the value is the
    body sealed in its marker and the ``saga-codec`` header names the chain."""
    # read once per field, without pydantic's attribute hooks
    return encode_fields(envelope.__dict__, envelope.body, codec, blobs=blobs)


def encode_fields(
    fields: dict[str, Any],
    body: Any,
    codec: CodecChain | None = None,
    *,
    blobs: dict[str, bytes] | None = None,
) -> tuple[bytes, bytes, Headers]:
    """``encode`` for a message the engine or the kit builds itself from values it has
    checked already (a command from its decision, a reply to a decoded command): the
    envelope's fields by name, without an ``Envelope`` validated for the purpose. A field
    left out takes the envelope's default: a new ``id``, ``time`` now, the schema
    version; empty otherwise. A value may be given as its header's bytes.

    ``blobs``: a body the chain's ``ref`` codec takes goes by reference, its blob put in
    ``blobs`` for the caller to keep before the record is sent (``_record_blobs``);
    None: the body goes inline, whatever its size."""
    names = tuple(fields)
    plan = _PLANS.get(names) or _plan(names)
    headers: Headers = list(FIXED_HEADERS)
    for header, field_name in plan:
        if type(field_name) is not str:  # a field left out: its default
            headers.append((header, field_name()))  # type: ignore[operator]
            continue
        value = fields[field_name]
        kind = type(value)
        if kind is str:  # most headers: the fast path
            if value:
                headers.append((header, value.encode()))
            continue
        if kind is MessageType:
            headers.append((header, _TYPE_BYTES[value]))
            continue
        if kind is bool:
            if value:
                headers.append((header, b"true"))
            continue
        if kind is bytes:
            if value:
                headers.append((header, value))
            continue
        if isinstance(value, datetime):
            headers.append((header, _time_text(value)))
            continue
        text = str(value.value if isinstance(value, StrEnum) else value)
        if text:
            headers.append((header, text.encode()))
    value_bytes = orjson.dumps(body, option=orjson.OPT_UTC_Z)
    if codec is not None:
        value_bytes, headers = seal_value(value_bytes, headers, codec, blobs)
    return fields["saga_id"].encode(), value_bytes, headers


def seal_value(
    value: bytes, headers: Headers, codec: CodecChain | None, blobs: dict[str, bytes] | None
) -> tuple[bytes, Headers]:
    """A record's value (its body's JSON) as sent: sealed by ``codec`` (the ``saga-codec``
    header added), by reference when its ``ref`` codec takes it and ``blobs`` is given
    (see ``encode_fields``); as it is without a codec."""
    if codec is not None and not _goes_clear(codec, value, blobs):
        if blobs is not None and codec.reference is not None:
            with collecting(blobs):
                value = codec.seal_json(value)
        else:
            value = codec.seal_json(value)
        headers.append((CODEC_HEADER, codec.header))
    return value, headers


def _goes_clear(codec: CodecChain, value: bytes, blobs: dict[str, bytes] | None) -> bool:
    """A chain of the ``ref`` codec alone leaves a record clear (no marker, no
    ``saga-codec`` header) unless it goes by reference: a reader without a blob store
    (a participant that never gets a large command) reads it as any record."""
    ref = codec.reference
    if ref is None or len(codec.codecs) > 1:
        return False
    return blobs is None or len(value) < ref.threshold


def fixed_headers_size() -> int:
    """The bytes of the headers every record ``encode_fields`` writes carries, whatever
    its fields (their names and values)."""
    return record_size(None, list(FIXED_HEADERS))


def record_size(value: bytes | None, headers: Headers) -> int:
    """A record's size as the size rule counts it (``check_message_size``): its value
    and every header name and value, in bytes (``decode`` counts the same, in its pass
    over the headers)."""
    return (len(value) if value else 0) + sum(len(name) + len(raw) for name, raw in headers)


_MESSAGE_TYPES = frozenset(t.value for t in MessageType)
#: The messages that answer (or are answered as) a command: they name it.
_NEED_COMMAND_ID = frozenset({MessageType.REPLY, MessageType.UNDO})


def start_envelope(
    request: StartRequest,
    *,
    source: str,
    correlation_id: str | None = None,
    causation_id: str | None = None,
) -> Envelope:
    """The inbox message of a start request (its saga id decided by the sender, so that a
    re-sent message names the same saga). Fields at their defaults are left out of the
    body: an engine that predates one (its body model allows no other field) still takes
    every start that does not use it."""
    request = request.with_saga_id()
    assert request.saga_id is not None
    body = StartBody(
        input=request.input,
        idempotency_key=request.idempotency_key,
        deadline_s=request.deadline.total_seconds() if request.deadline else None,
        parent=request.parent,
        trigger=request.trigger,
        priority=request.priority,
        fairness_key=request.fairness_key,
        rerun_of=request.rerun_of,
    )
    return Envelope(
        message_type=MessageType.START,
        source=source,
        subject=request.saga_type,
        saga_id=request.saga_id,
        saga_type=request.saga_type,
        correlation_id=correlation_id or request.saga_id,
        causation_id=causation_id or "",
        traceparent=request.trace_context.get("traceparent", ""),
        tracestate=request.trace_context.get("tracestate", ""),
        body=body.model_dump(mode="json", exclude_defaults=True),
    )


def start_request(envelope: Envelope) -> StartRequest:
    """The start request an inbox message carries (PoisonMessage if its body is not one)."""
    body = envelope.body_as(StartBody)
    trace = {"traceparent": envelope.traceparent, "tracestate": envelope.tracestate}
    return StartRequest(
        saga_type=envelope.saga_type or envelope.subject,
        input=body.input,
        saga_id=envelope.saga_id,
        idempotency_key=body.idempotency_key,
        deadline=timedelta(seconds=body.deadline_s) if body.deadline_s else None,
        trace_context={k: v for k, v in trace.items() if v},
        parent=body.parent,
        trigger=body.trigger,
        priority=body.priority,
        fairness_key=body.fairness_key,
        rerun_of=body.rerun_of,
    )


def decode(
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    *,
    max_bytes: int,
    codec: CodecChain | None = None,
) -> Envelope:
    """Reads a Kafka record; raises PoisonMessage with the precise reason. A value with a
    ``saga-codec`` header is decoded with ``codec`` first (a clear one is read as is)."""
    found, fields = _checked_headers(value, headers, max_bytes)
    if CODEC_HEADER in found:
        value = _unsealed(value, found[CODEC_HEADER], codec)
    refused: UnstorableValue | None = None
    try:
        body = loads(value or b"")
    except UnstorableValue as exc:
        # Nested too deep to read: the headers are still read and checked, so a
        # participant can answer the command (PoisonMessage.envelope).
        body, refused = {}, exc
    except SerializationError as exc:
        raise PoisonMessage(PoisonReason.MALFORMED_JSON, f"the body is not JSON: {exc}") from None
    envelope = _envelope(key, fields, body)
    if refused is not None:
        what = f"{envelope.subject or envelope.message_type.value} body"
        error = too_deep(what)
        raise PoisonMessage(
            PoisonReason.UNSTORABLE_VALUE, str(error), envelope=envelope, body_error=error
        )
    return envelope


def _checked_headers(
    value: bytes | None, headers: Headers, max_bytes: int
) -> tuple[dict[str, str], dict[str, str]]:
    """The record's headers as text, once its size and the headers every message needs
    (spec and schema versions, content type, a known type) are checked: the envelope's
    by field name (``_envelope`` takes them as they are), the others by header name."""
    # One pass for the size and the text (every record of the hot path comes here); the
    # size is refused first, as it always was.
    size = len(value) if value else 0
    found: dict[str, str] = {}
    fields: dict[str, str] = {}
    field_of = _FIELD_OF_HEADER.get
    not_utf8: str | None = None
    for name, raw in headers:
        size += len(name)
        if raw:
            size += len(raw)
            try:
                text = raw.decode()
            except UnicodeDecodeError:
                not_utf8 = not_utf8 or name
                continue
        else:
            text = ""
        field_name = field_of(name)
        if field_name is None:
            found[name] = text
        else:
            fields[field_name] = text
    try:
        check_message_size(size, max_bytes, "the record")
    except PayloadTooLarge as exc:
        raise PoisonMessage(PoisonReason.OVERSIZED, str(exc)) from None
    if not_utf8 is not None:
        raise PoisonMessage(PoisonReason.MISSING_HEADER, f"header {not_utf8} is not UTF-8")
    if not all(map(fields.get, _REQUIRED_FIELDS)):
        missing = [
            h for h, f in zip(REQUIRED_HEADERS, _REQUIRED_FIELDS, strict=True) if not fields.get(f)
        ]
        raise PoisonMessage(PoisonReason.MISSING_HEADER, f"missing header(s): {', '.join(missing)}")
    if found.get("ce_specversion", CE_SPECVERSION) != CE_SPECVERSION:
        raise PoisonMessage(
            PoisonReason.WRONG_SCHEMA_VERSION,
            f"CloudEvents spec version {found['ce_specversion']!r}; expected {CE_SPECVERSION!r}",
        )
    content_type = found.get("content-type", "application/json").split(";")[0].strip()
    if content_type != "application/json":
        raise PoisonMessage(
            PoisonReason.INVALID_BODY, f"content-type {content_type!r}; expected application/json"
        )
    if fields["schema_version"] != SCHEMA_VERSION:
        raise PoisonMessage(
            PoisonReason.WRONG_SCHEMA_VERSION,
            f"schema version {fields['schema_version']!r}; this engine reads {SCHEMA_VERSION!r}",
        )
    if fields["message_type"] not in _MESSAGE_TYPES:
        raise PoisonMessage(
            PoisonReason.UNKNOWN_TYPE,
            f"unknown message type {fields['message_type']!r}; expected one of "
            f"{', '.join(t.value for t in MessageType)}",
        )
    return found, fields


#: Header name -> Envelope field; the envelope's fields in order, at their defaults (the
#: id and the time are made by default factories: ``ce_id`` is required, and an envelope
#: without ``ce_time`` is validated).
_FIELD_OF_HEADER = {header: field_name for field_name, header in HEADERS.items()}
_AT_DEFAULTS = {field_name: _DEFAULTS.get(field_name) for field_name in Envelope.model_fields}
_MESSAGE_TYPE_OF = {t.value: t for t in MessageType}
_REQUIRED_FIELDS = tuple(_FIELD_OF_HEADER[h] for h in REQUIRED_HEADERS)
_TIME = TypeAdapter(datetime)
_SAGA_ID_MAX = Envelope.model_fields["saga_id"].metadata[-1].max_length


def _fast_envelope(fields: dict[str, str], body: Any) -> Envelope | None:
    """The envelope ``Envelope.model_validate`` makes of the checked headers' fields,
    without validating again what ``_checked_headers`` did: every value is text, the
    type is known, the required headers are there. The time is validated as the model
    does (by its own validator). None where validation could refuse (a saga id too
    long, a time that is not one) or a default is made: ``model_validate`` decides."""
    time_text = fields.get("time")
    if time_text is None or "id" not in fields or len(fields["saga_id"]) > _SAGA_ID_MAX:
        return None
    try:
        time = _TIME.validate_python(time_text)
    except ValidationError:
        return None
    # What validation records as set: the fields given (each header's, and these two).
    fields_set = set(fields)
    fields_set.update(("compensation", "body"))
    values: dict[str, Any] = {**_AT_DEFAULTS, **fields}
    values["message_type"] = _MESSAGE_TYPE_OF[fields["message_type"]]
    values["time"] = time
    values["compensation"] = fields.get("compensation") == "true"
    values["body"] = body
    envelope = Envelope.__new__(Envelope)
    object.__setattr__(envelope, "__dict__", values)
    object.__setattr__(envelope, "__pydantic_fields_set__", fields_set)
    object.__setattr__(envelope, "__pydantic_extra__", None)
    object.__setattr__(envelope, "__pydantic_private__", None)
    return envelope


def _envelope(key: bytes | None, fields: dict[str, str], body: Any) -> Envelope:
    """The envelope the checked headers' fields and the read body make, keyed by its saga."""
    envelope = _fast_envelope(fields, body) or _validated_envelope(fields, body)
    if key is not None and key.decode(errors="replace") != envelope.saga_id:
        raise PoisonMessage(
            PoisonReason.KEY_MISMATCH, "the record key must be the saga id (ce_sagaid)"
        )
    if envelope.message_type in _NEED_COMMAND_ID and not envelope.command_id:
        # After checks 1-11 (PROTOCOL.md 7.5), with the envelope: a participant makes its
        # check 12 (a reply is not a command) before this one.
        raise PoisonMessage(
            PoisonReason.MISSING_HEADER,
            f"a {envelope.message_type.value} needs ce_commandid",
            envelope=envelope,
        )
    return envelope


def _validated_envelope(fields: dict[str, str], body: Any) -> Envelope:
    given: dict[str, Any] = {**fields, "body": body}
    given["compensation"] = fields.get("compensation") == "true"
    try:
        return Envelope.model_validate(given)
    except ValidationError as exc:
        raise PoisonMessage(PoisonReason.MISSING_HEADER, f"bad header values: {exc}") from None


def _unsealed(value: bytes | None, chain_name: str, codec: CodecChain | None) -> bytes:
    if codec is None:
        raise PoisonMessage(
            PoisonReason.UNDECODABLE,
            f"the value is encoded ({CODEC_HEADER}: {chain_name}) and this process has no "
            "codec configured (SAGA_CODEC__KEYS)",
        )
    try:
        return codec.open_raw(loads(value or b""))
    except (CodecError, SerializationError) as exc:
        # A reference whose blob is missing or altered has its own reasons (one home).
        reason = dead_letter_reason(exc) if isinstance(exc, CodecError) else None
        raise PoisonMessage(
            reason or PoisonReason.UNDECODABLE, f"{CODEC_HEADER}: {chain_name}: {exc}"
        ) from None

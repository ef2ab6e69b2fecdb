"""The wire format on Kafka, for code that speaks it without the participant kit.

``proto/PROTOCOL.md`` is the contract (``proto/schemas/`` its JSON Schemas); this module
is its Python side, the one the engine, the kit and the client use:

- topics: ``Topics`` (``{prefix}.inbox``, ``{prefix}.cmd.{participant}``,
  ``{prefix}.dlq``, ``{prefix}.progress``) and the partition a key goes to (``key_hash``, ``partition_for``);
- messages: ``Envelope`` (the ``ce_*`` headers and the JSON body; ``HEADERS`` maps its
  fields to header names, ``REQUIRED_HEADERS`` must be present), ``MessageType`` (the
  ``ce_type``), the bodies (``ReplyBody``, ``StartBody``, ``SignalBody``, ``CancelBody``,
  ``ReloadBody``, ``UndoBody``; ``BODY_MODELS`` by type), ``SCHEMA_VERSION`` and ``CE_SPECVERSION``;
- ``encode`` an envelope to a Kafka key, value and headers, ``decode`` a record back,
  raising ``PoisonMessage`` with its ``PoisonReason`` (the ``dlq_reason`` header);
- payload codecs (PROTOCOL.md, "Encoded payloads"): a value sealed by a codec chain is
  the JSON marker ``{CODEC_MARKER: "<chain>", "data": "<base64>"}`` with the
  ``CODEC_HEADER`` header naming the chain; ``encode``/``decode`` take ``codec=``;
- ids (PROTOCOL.md section 6): ``command_id_for`` and ``saga_id_for``, both derived
  deterministically;
- a participant's progress report on ``{prefix}.progress`` (PROTOCOL.md section 5b):
  ``StepProgressRecord``, its value at most ``STEP_PROGRESS_MAX_BYTES``.

::

    from saga_engine.protocol import Envelope, MessageType, ReplyBody, decode, encode

    command = decode(record.key, record.value, record.headers, max_bytes=1_000_000)
    reply = Envelope(
        message_type=MessageType.REPLY,
        source="/participants/payments",
        saga_id=command.saga_id,
        command_id=command.command_id,
        causation_id=command.id,
        correlation_id=command.correlation_id,
        body=ReplyBody(outcome="success", payload={"reservation": "r-1"}).model_dump(),
    )
    key, value, headers = encode(reply)
    await producer.send_and_wait(command.reply_to, value, key=key, headers=headers)
"""

from saga_engine.core.history._decision import command_id_for, saga_id_for
from saga_engine.kernel._errors import PoisonMessage, PoisonReason
from saga_engine.kernel._partitioning import key_hash, partition_for
from saga_engine.transport._step_progress import STEP_PROGRESS_MAX_BYTES, StepProgressRecord
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import (
    BODY_MODELS,
    CE_SPECVERSION,
    CODEC_HEADER,
    CODEC_MARKER,
    HEADERS,
    REQUIRED_HEADERS,
    SCHEMA_VERSION,
    CancelBody,
    Envelope,
    Headers,
    MessageType,
    ReloadBody,
    ReplyBody,
    SignalBody,
    StartBody,
    UndoBody,
    decode,
    encode,
)

__all__ = [
    "BODY_MODELS",
    "CE_SPECVERSION",
    "CODEC_HEADER",
    "CODEC_MARKER",
    "HEADERS",
    "REQUIRED_HEADERS",
    "SCHEMA_VERSION",
    "STEP_PROGRESS_MAX_BYTES",
    "CancelBody",
    "Envelope",
    "Headers",
    "MessageType",
    "PoisonMessage",
    "PoisonReason",
    "ReloadBody",
    "ReplyBody",
    "SignalBody",
    "StartBody",
    "StepProgressRecord",
    "Topics",
    "UndoBody",
    "command_id_for",
    "decode",
    "encode",
    "key_hash",
    "partition_for",
    "saga_id_for",
]

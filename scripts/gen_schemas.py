"""Generates the JSON Schemas (draft 2020-12) in ``proto/schemas/`` from the wire models.

Usage::

    python scripts/gen_schemas.py           # (re)writes proto/schemas/*.schema.json
    python scripts/gen_schemas.py --check   # exits 1, listing the files that drifted

The body schemas come from the pydantic models in ``saga_engine.transport._wire``; the envelope
schema is the ``Envelope`` model annotated with the Kafka header each field travels in;
the header schemas are built from ``HEADERS``, ``REQUIRED_HEADERS``, ``MessageType`` and
``PoisonReason``. The output is deterministic (sorted keys, two-space indent, trailing
newline), so the committed files can be diffed, and ``tests/test_proto.py`` fails when
they fall behind the code.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python scripts/gen_schemas.py` from anywhere
    sys.path.insert(0, str(ROOT))

from pydantic import BaseModel  # noqa: E402

from saga_engine.protocol import (  # noqa: E402
    BODY_MODELS,
    CE_SPECVERSION,
    CODEC_HEADER,
    CODEC_MARKER,
    HEADERS,
    REQUIRED_HEADERS,
    SCHEMA_VERSION,
    STEP_PROGRESS_MAX_BYTES,
    CancelBody,
    Envelope,
    MessageType,
    PoisonReason,
    ReloadBody,
    ReplyBody,
    SignalBody,
    StartBody,
    StepProgressRecord,
    UndoBody,
    command_id_for,
    saga_id_for,
)

Schema = dict[str, Any]

SCHEMA_DIR = ROOT / "proto" / "schemas"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: An identifier, never fetched: ``$ref``s between the files resolve against it.
ID_BASE = f"https://saga-engine.dev/proto/v{SCHEMA_VERSION}/"

#: Headers every message carries besides REQUIRED_HEADERS (CloudEvents binary mode).
SPECVERSION_HEADER = "ce_specversion"
CONTENT_TYPE_HEADER = "content-type"
CONTENT_TYPE = "application/json"

BODY_SCHEMAS: dict[str, tuple[type[BaseModel], MessageType, str]] = {
    # file name: (model, the message type whose body it is, fallback description)
    "reply.schema.json": (
        ReplyBody,
        MessageType.REPLY,
        "A participant's answer to a command.",
    ),
    "start.schema.json": (
        StartBody,
        MessageType.START,
        "A request to start a saga (the saga id is the message key).",
    ),
    "signal.schema.json": (
        SignalBody,
        MessageType.SIGNAL,
        "A signal for a running saga; the engine delivers each signal_id at most once per saga.",
    ),
    "cancel.schema.json": (
        CancelBody,
        MessageType.CANCEL,
        "A request to cancel a running saga; its completed steps are compensated.",
    ),
    "reload.schema.json": (
        ReloadBody,
        MessageType.RELOAD,
        "From one engine to another: the saga's history changed, rebuild it from history.",
    ),
    "undo.schema.json": (
        UndoBody,
        MessageType.UNDO,
        "From one engine to another: a parent saga compensates, so its child undoes what it did.",
    ),
}

BODY_EXAMPLES: dict[MessageType, list[Any]] = {
    MessageType.REPLY: [
        {"outcome": "success", "payload": {"reservation_id": "r-981"}},
        {"outcome": "failure", "error": "out of stock", "payload": {"sku": "A-1"}},
        {"outcome": "retryable", "error": "database unavailable"},
    ],
    MessageType.START: [
        {"input": {"order_id": "o-42", "amount": 1999}, "idempotency_key": "order-42"},
        {"input": {"order_id": "o-43"}, "deadline_s": 600},
        {
            "input": {"order_id": "o-44"},
            "parent": {
                "saga_id": "8f14e45f-ea3b-4c1b-9f6e-2b0c1d8a7e55",
                "command_id": "0c2d7a4e-5b1f-5e39-8a6c-3f9d2e1b7a40",
                "saga_type": "checkout",
            },
        },
        {
            "input": {"order_id": "o-45"},
            "idempotency_key": "orders-o-45",
            "trigger": {"topic": "orders", "partition": 3, "offset": 1881},
        },
    ],
    MessageType.SIGNAL: [
        {"name": "approval", "signal_id": "approval-o-42", "payload": {"approved": True}},
    ],
    MessageType.CANCEL: [
        {"reason": "customer cancelled the order", "principal": "support:alice"},
    ],
    MessageType.RELOAD: [{"changed_by": "engine-2"}, {}],
    MessageType.UNDO: [{"parent_id": "8f14e45f-ea3b-4c1b-9f6e-2b0c1d8a7e55", "reason": ""}],
}

#: What each header means on the wire, beyond the Envelope field it maps to. A header
#: added to HEADERS without a note here falls back to the field's own description.
HEADER_NOTES: dict[str, str] = {
    "ce_id": "CloudEvents id: unique per message (a UUID). A re-sent command gets a new "
    "ce_id but keeps its ce_commandid, so never deduplicate on ce_id.",
    "ce_type": "CloudEvents type: the message type, which decides the body's schema.",
    "ce_source": "CloudEvents source: who sent the message, e.g. /saga-engine/<instance> "
    "or /participants/payments.",
    "ce_subject": "CloudEvents subject. saga.command: the command type; saga.start: the "
    "saga type; saga.signal: the signal name. Informational on replies.",
    "ce_time": "CloudEvents time: when the message was created, RFC 3339 in UTC "
    "(e.g. 2025-01-31T12:00:00.123456Z).",
    "ce_sagaid": "The saga id, 1 to 200 characters. The record key must be the same UTF-8 bytes.",
    "ce_sagatype": "The saga type. saga.start: which saga to start (the engine falls back "
    "to ce_subject when it is absent).",
    "ce_commandid": "The command id: the idempotency key of a command. A reply copies it "
    "from the command it answers; the engine matches replies by it.",
    "ce_step": "Commands: the name of the saga step the command belongs to (the same for "
    "a step's forward command and its compensation).",
    "ce_correlationid": "The saga id; a reply copies it from the command.",
    "ce_causationid": "The message this one answers: a reply carries the ce_id of the "
    "command it answers. (The engine's commands carry their own command id here.)",
    "ce_replyto": "Commands: the topic the reply goes to ({prefix}.inbox).",
    "ce_schemaversion": "The wire schema version. The engine reads only this version and "
    "dead-letters any other (dlq_reason wrong_schema_version).",
    "ce_compensation": 'Commands: "true" on a compensating command. Absent (or anything '
    'but "true") means a forward command; the engine never sends "false".',
    "traceparent": "W3C Trace Context traceparent, e.g. "
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.",
    "tracestate": "W3C Trace Context tracestate (vendor-specific trace data), sent with "
    "traceparent.",
}

# The examples use real ids: the saga started with idempotency key "order-42" and the
# first forward command of its step "reserve-stock".
_SAGA_ID = saga_id_for("checkout", "order-42")
_COMMAND_ID = command_id_for(_SAGA_ID, "reserve-stock", 0, compensation=False)
_COMMAND_CE_ID = "0b7f4f3e-5d0c-4a57-9b8e-2f4a1c6d9e01"

HEADER_EXAMPLES: list[dict[str, str]] = [
    {
        "ce_specversion": CE_SPECVERSION,
        "content-type": CONTENT_TYPE,
        "ce_id": _COMMAND_CE_ID,
        "ce_type": MessageType.COMMAND.value,
        "ce_source": "/saga-engine/engine-1",
        "ce_subject": "ReserveStock",
        "ce_time": "2025-01-31T12:00:00.123456Z",
        "ce_sagaid": _SAGA_ID,
        "ce_sagatype": "checkout",
        "ce_commandid": _COMMAND_ID,
        "ce_step": "reserve-stock",
        "ce_correlationid": _SAGA_ID,
        "ce_causationid": _COMMAND_ID,
        "ce_replyto": "saga.inbox",
        "ce_schemaversion": SCHEMA_VERSION,
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "ce_senttime": "2025-01-31T12:00:00.124012Z",
    },
    {
        "ce_specversion": CE_SPECVERSION,
        "content-type": CONTENT_TYPE,
        "ce_id": "9d3c2b1a-0f4e-4d6c-8b7a-6e5d4c3b2a19",
        "ce_type": MessageType.REPLY.value,
        "ce_source": "/participants/inventory",
        "ce_time": "2025-01-31T12:00:00.456789Z",
        "ce_sagaid": _SAGA_ID,
        "ce_commandid": _COMMAND_ID,
        "ce_correlationid": _SAGA_ID,
        "ce_causationid": _COMMAND_CE_ID,
        "ce_schemaversion": SCHEMA_VERSION,
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01",
        "ce_senttime": "2025-01-31T12:00:00.124012Z",
        "ce_receivedtime": "2025-01-31T12:00:00.126530Z",
        "ce_handlerstarttime": "2025-01-31T12:00:00.127104Z",
        "ce_handlerendtime": "2025-01-31T12:00:00.131877Z",
        "ce_committime": "2025-01-31T12:00:00.133260Z",
        "ce_handlercpums": "1.842",
    },
]

DLQ_HEADERS: dict[str, Schema] = {
    "dlq_reason": {
        "description": "Why the record was dead-lettered: a poison reason, or engine_error "
        "when the consumer failed on it for a reason of its own (a bug, or a saga another "
        "engine kept writing to), not bad input.",
        "enum": [r.value for r in PoisonReason],
    },
    "dlq_detail": {
        "description": "A human-readable explanation (at most 2000 characters).",
        "maxLength": 2000,
    },
    "dlq_topic": {"description": "The topic the record was read from.", "minLength": 1},
    "dlq_partition": {
        "description": "The partition it was read from, in decimal.",
        "pattern": "^[0-9]+$",
    },
    "dlq_offset": {
        "description": "Its offset in that partition, in decimal.",
        "pattern": "^[0-9]+$",
    },
    "dlq_consumer": {
        "description": "The consumer that gave up on it: an engine instance id, or a participant "
        "instance (the Python kit writes participant:{name}:{instance}).",
        "minLength": 1,
    },
    "dlq_truncated": {
        "description": "Present only when the record was too large even for the dead-letter "
        "topic: the value holds its first 64 KiB and this header its original size in bytes.",
        "pattern": "^[0-9]+$",
    },
}
DLQ_REQUIRED = [
    "dlq_reason",
    "dlq_detail",
    "dlq_topic",
    "dlq_partition",
    "dlq_offset",
    "dlq_consumer",
]


# --------------------------------------------------------------------------- building


def _frame(name: str, title: str, description: str, schema: Schema) -> Schema:
    """Adds the dialect, the id, the title and the description every file carries."""
    framed: Schema = {"$schema": DIALECT, "$id": ID_BASE + name}
    framed.update(schema)
    framed["title"] = title
    framed["description"] = description
    return framed


def body_schema(name: str) -> Schema:
    model, message_type, fallback = BODY_SCHEMAS[name]
    generated = model.model_json_schema()
    title = str(generated.pop("title", model.__name__))
    description = str(generated.pop("description", fallback))
    description += (
        f" The Kafka value of a {message_type.value} message (content-type {CONTENT_TYPE})."
    )
    generated["examples"] = BODY_EXAMPLES[message_type]
    return _frame(name, title, description, generated)


def _body_ref(message_type: MessageType) -> Schema:
    model = BODY_MODELS[message_type]
    for file_name, (schema_model, _, _) in BODY_SCHEMAS.items():
        if schema_model is model:
            return {"$ref": file_name}
    if model is not None:
        raise SystemExit(
            f"{model.__name__} (the body of {message_type.value}) has no schema file: "
            "add it to BODY_SCHEMAS in scripts/gen_schemas.py"
        )
    # saga.command: the body is the command's own JSON object, defined by the saga.
    return {
        "type": "object",
        "description": "the command's payload: a JSON object whose shape the saga's author "
        "defines for the command type (ce_subject)",
    }


def envelope_schema() -> Schema:
    generated = Envelope.model_json_schema()
    generated.pop("title", None)
    generated.pop("description", None)
    properties: dict[str, Schema] = generated["properties"]
    missing = sorted(set(HEADERS) - set(properties))
    if missing:
        raise SystemExit(f"HEADERS names fields Envelope does not have: {', '.join(missing)}")
    for field, header in HEADERS.items():
        properties[field]["x-kafka-header"] = header
    properties["saga_id"]["x-kafka-key"] = True
    properties["body"]["x-kafka-value"] = True
    properties["schema_version"]["const"] = SCHEMA_VERSION
    properties["compensation"]["description"] += (
        ' (on the wire: the header is "true", or absent for false)'
    )
    # What the engine requires on the wire; the model fills the others with defaults.
    generated["required"] = [f for f, h in HEADERS.items() if h in REQUIRED_HEADERS] + ["body"]
    generated["allOf"] = [
        {
            "if": {
                "properties": {"message_type": {"const": kind.value}},
                "required": ["message_type"],
            },
            "then": {"properties": {"body": _body_ref(kind)}},
        }
        for kind in MessageType
    ]
    description = (
        "One saga-engine message on Kafka, in the CloudEvents Kafka protocol binding, "
        "binary mode. Every property except body travels as a Kafka header, named by its "
        "x-kafka-header annotation: header values are UTF-8 strings, times are RFC 3339, "
        'booleans are "true" or absent, and empty strings are not sent. body is the record '
        "value, a JSON document whose schema depends on message_type. The record key is the "
        "saga id (UTF-8). Every message also carries the headers ce_specversion "
        f"({CE_SPECVERSION}) and content-type ({CONTENT_TYPE}); headers.schema.json describes "
        "the headers as they appear on the record."
    )
    return _frame("envelope.schema.json", "Envelope", description, generated)


def _header_property(field: str, header: str, field_schema: Schema) -> Schema:
    prop: Schema = {
        "type": "string",
        "description": HEADER_NOTES.get(header) or str(field_schema.get("description", "")),
        "x-envelope-field": field,
    }
    if header in REQUIRED_HEADERS:
        prop["minLength"] = 1  # an empty required header counts as missing
    if field == "message_type":
        prop["enum"] = [t.value for t in MessageType]
    elif field == "schema_version":
        prop["const"] = SCHEMA_VERSION
    elif field == "compensation":
        prop["enum"] = ["true", "false"]
    elif header.endswith("time"):  # ce_time and the timing headers (PROTOCOL.md 7.4a)
        prop["format"] = "date-time"
    elif header == "ce_handlercpums":
        prop["pattern"] = "^[0-9]+(\\.[0-9]+)?$"
    for key in ("minLength", "maxLength"):
        if key in field_schema:
            prop[key] = field_schema[key]
    return prop


def _requires(kind: MessageType, schema: Schema) -> Schema:
    return {
        "if": {"properties": {"ce_type": {"const": kind.value}}, "required": ["ce_type"]},
        "then": schema,
    }


def headers_schema() -> Schema:
    fields: dict[str, Schema] = Envelope.model_json_schema()["properties"]
    properties: dict[str, Schema] = {
        SPECVERSION_HEADER: {
            "type": "string",
            "const": CE_SPECVERSION,
            "description": "CloudEvents spec version.",
        },
        CONTENT_TYPE_HEADER: {
            "type": "string",
            "const": CONTENT_TYPE,
            "description": "The media type of the value: always JSON.",
        },
    }
    for field, header in HEADERS.items():
        properties[header] = _header_property(field, header, fields[field])
    properties[CODEC_HEADER] = {
        "type": "string",
        "pattern": "^[a-z0-9._-]+(,[a-z0-9._-]+)*$",
        "description": "Present when the value is encoded by a payload codec chain: the "
        "codec names in the order they encoded (compression before encryption), e.g. "
        '"zstd,aes-gcm". The value is then encoded-value.schema.json; decode it (PROTOCOL.md, '
        '"Encoded payloads") to get the body its ce_type describes.',
        "examples": ["zstd,aes-gcm", "aes-gcm"],
    }
    engine_sets = [HEADERS[f] for f in ("subject", "time", "saga_type", "command_id", "step")]
    engine_sets += [HEADERS[f] for f in ("correlation_id", "causation_id", "reply_to")]
    schema: Schema = {
        "type": "object",
        "properties": properties,
        "required": [SPECVERSION_HEADER, CONTENT_TYPE_HEADER, *REQUIRED_HEADERS],
        # Other headers are allowed and ignored by the engine.
        "additionalProperties": {"type": "string"},
        "allOf": [
            # The engine always sends these on a command: a participant may rely on them.
            _requires(MessageType.COMMAND, {"required": engine_sets}),
            # A reply without its command id cannot be matched: dead-lettered.
            _requires(MessageType.REPLY, {"required": [HEADERS["command_id"]]}),
            # Which saga to start: ce_sagatype, or else ce_subject.
            _requires(
                MessageType.START,
                {
                    "anyOf": [
                        {"required": [HEADERS["saga_type"]]},
                        {"required": [HEADERS["subject"]]},
                    ]
                },
            ),
        ],
        "examples": copy.deepcopy(HEADER_EXAMPLES),
    }
    description = (
        "The Kafka headers of a saga-engine message (CloudEvents Kafka protocol binding, "
        "binary mode), as a JSON object of header name to UTF-8 string value. required lists "
        "what every message must carry; the allOf conditions add what a message of a given "
        "ce_type needs to be processed: what the engine always puts on a command, the "
        "command id on a reply, the saga type on a start request."
    )
    return _frame("headers.schema.json", "Headers", description, schema)


def dlq_headers_schema() -> Schema:
    properties = {name: {"type": "string", **spec} for name, spec in DLQ_HEADERS.items()}
    schema: Schema = {
        "type": "object",
        "properties": properties,
        "required": DLQ_REQUIRED,
        # The original record's headers are kept (minus any earlier dlq_* ones).
        "additionalProperties": {"type": "string"},
        "examples": [
            {
                "ce_id": "9d3c2b1a-0f4e-4d6c-8b7a-6e5d4c3b2a19",
                "ce_type": MessageType.REPLY.value,
                "dlq_reason": PoisonReason.UNKNOWN_COMMAND.value,
                "dlq_detail": f"saga {_SAGA_ID} never issued command 'f00'",
                "dlq_topic": "saga.inbox",
                "dlq_partition": "3",
                "dlq_offset": "1742",
                "dlq_consumer": "engine-1-5f3a9c1e",
            }
        ],
    }
    description = (
        "The headers of a record on the dead-letter topic ({prefix}.dlq). The record keeps "
        "the original key, value and headers (minus any earlier dlq_* headers) and gains "
        "these dlq_* headers saying why and where from. Header values are UTF-8 strings "
        "(an original header may not be, when that was the reason)."
    )
    return _frame("dlq-headers.schema.json", "DeadLetterHeaders", description, schema)


def encoded_value_schema() -> Schema:
    schema: Schema = {
        "type": "object",
        "properties": {
            CODEC_MARKER: {
                "type": "string",
                "pattern": "^[a-z0-9._-]+(,[a-z0-9._-]+)*$",
                "description": "The codec chain that encoded data, in encoding order: the "
                "same as the saga-codec header.",
            },
            "data": {
                "type": "string",
                "contentEncoding": "base64",
                "description": "Standard base64 (with padding) of the chain's output; decoded "
                "by each codec in reverse order, it is the body's JSON text (UTF-8).",
            },
        },
        "required": [CODEC_MARKER, "data"],
        "additionalProperties": False,
        "examples": [{CODEC_MARKER: "aes-gcm", "data": "AQJrMQ..."}],
    }
    description = (
        "A value encoded by a payload codec (a record with the saga-codec header, or a "
        "payload field of a stored event): the marker that says how it was encoded and the "
        "encoded bytes. PROTOCOL.md gives each codec's layout byte by byte."
    )
    return _frame("encoded-value.schema.json", "EncodedValue", description, schema)


def progress_schema() -> Schema:
    """The value of a progress record on ``{prefix}.progress`` (PROTOCOL.md section 5b)."""
    generated = StepProgressRecord.model_json_schema()
    generated.pop("title", None)
    generated.pop("description", None)
    generated["examples"] = [
        {
            "saga_id": saga_id_for("checkout", "order-42"),
            "command_id": command_id_for(
                saga_id_for("checkout", "order-42"), "reserve-stock", 0, compensation=False
            ),
            "step": "reserve-stock",
            "attempt": 1,
            "seq": 3,
            "at": "2025-01-31T12:00:01.500000Z",
            "body": {"reserved": 12, "of": 40},
        }
    ]
    description = (
        "A participant's report on the command it is handling (saga.progress on "
        f"{{prefix}}.progress, keyed by the saga id): not durable; at most "
        f"{STEP_PROGRESS_MAX_BYTES} bytes of JSON, body included."
    )
    return _frame("progress.schema.json", "StepProgress", description, generated)


def build() -> dict[str, Schema]:
    """Every schema file, by file name."""
    schemas: dict[str, Schema] = {
        "envelope.schema.json": envelope_schema(),
        "headers.schema.json": headers_schema(),
        "dlq-headers.schema.json": dlq_headers_schema(),
        "encoded-value.schema.json": encoded_value_schema(),
        "progress.schema.json": progress_schema(),
    }
    for name in BODY_SCHEMAS:
        schemas[name] = body_schema(name)
    return dict(sorted(schemas.items()))


def render(schema: Schema) -> str:
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def rendered() -> dict[str, str]:
    """Every schema file's exact text, by file name."""
    return {name: render(schema) for name, schema in build().items()}


def drift(directory: Path = SCHEMA_DIR) -> list[str]:
    """The files that differ from what the code generates, are missing, or are stale."""
    expected = rendered()
    problems = []
    for name, text in expected.items():
        path = directory / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{name}: differs from the models")
    if directory.is_dir():
        for path in sorted(directory.glob("*.json")):
            if path.name not in expected:
                problems.append(f"{path.name}: not generated any more (delete it)")
    return problems


def write(directory: Path = SCHEMA_DIR) -> list[str]:
    """Writes every schema; returns the names of the files that changed."""
    directory.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, text in rendered().items():
        path = directory / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8", newline="\n")
            changed.append(name)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file drifted"
    )
    args = parser.parse_args(argv)
    where = SCHEMA_DIR.relative_to(ROOT)
    if args.check:
        problems = drift()
        if problems:
            print(f"{where} is out of date with saga_engine/transport/_wire.py:", file=sys.stderr)
            for problem in problems:
                print(f"  {where}/{problem}", file=sys.stderr)
            print("run `python scripts/gen_schemas.py` and commit the result", file=sys.stderr)
            return 1
        print(f"{where}: {len(rendered())} schemas up to date")
        return 0
    changed = write()
    for name in changed:
        print(f"wrote {where}/{name}")
    stale = [p for p in drift() if p.endswith("(delete it)")]
    for problem in stale:
        print(f"warning: {where}/{problem}", file=sys.stderr)
    if not changed:
        print(f"{where}: {len(rendered())} schemas already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

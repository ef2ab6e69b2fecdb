"""Generates ``proto/asyncapi.json``, an AsyncAPI 3.0 document of the protocol, from the
same wire models as the JSON Schemas (``scripts/gen_schemas.py`` builds both).

Usage::

    python scripts/gen_asyncapi.py           # (re)writes proto/asyncapi.json
    python scripts/gen_asyncapi.py --check   # exits 1 if it drifted from the models

The document is written from a participant's and a client's side: they receive commands
on ``{prefix}.cmd.{participant}`` and reply on ``{prefix}.inbox`` (the operation's
``reply``), send starts, signals and cancels to the inbox, and send what they cannot
process to ``{prefix}.dlq``, and may report their progress on ``{prefix}.progress``. The schemas are the JSON Schema files' content, embedded
(AsyncAPI's default schema format is a superset of JSON Schema draft 7: the files'
``$defs`` become component schemas and their ``$ref``s point there). PROTOCOL.md stays
the specification; this document is for tools (code generators, browsers).
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
sys.path.insert(0, str(ROOT / "scripts"))

import gen_schemas  # noqa: E402

from saga_engine.protocol import SCHEMA_VERSION, MessageType  # noqa: E402

Schema = dict[str, Any]
TARGET = ROOT / "proto" / "asyncapi.json"

#: message type -> (component name, the schema file of its body, a one-line summary).
MESSAGES: dict[MessageType, tuple[str, str | None, str]] = {
    MessageType.COMMAND: ("Command", None, "A forward or compensating command for a participant."),
    MessageType.REPLY: ("Reply", "reply.schema.json", "A participant's answer to a command."),
    MessageType.START: ("Start", "start.schema.json", "A request to start a saga."),
    MessageType.SIGNAL: ("Signal", "signal.schema.json", "A signal to a running saga."),
    MessageType.CANCEL: ("Cancel", "cancel.schema.json", "A request to cancel a saga."),
    MessageType.RELOAD: ("Reload", "reload.schema.json", "An engine's note that a saga moved on."),
    MessageType.UNDO: ("Undo", "undo.schema.json", "A parent's request to undo a child saga."),
}
_FILE_NAMES = {f: name for name, f, _ in MESSAGES.values() if f} | {
    "headers.schema.json": "Headers",
    "dlq-headers.schema.json": "DeadLetterHeaders",
    "progress.schema.json": "StepProgress",
}


def _embedded(schema: Schema, components: dict[str, Schema]) -> Schema:
    """A schema file's content as a component: no ``$id``/``$schema``; its ``$defs``
    hoisted into ``components`` and every ``$ref`` pointing at a component."""
    schema = copy.deepcopy(schema)
    for key in ("$id", "$schema"):
        schema.pop(key, None)
    for name, definition in schema.pop("$defs", {}).items():
        components[name] = _embedded(definition, components)
    embedded: Schema = _refs(schema)
    return embedded


def _refs(node: Any) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = ref.removeprefix("#/$defs/")
            return {**node, "$ref": f"#/components/schemas/{_FILE_NAMES.get(target, target)}"}
        return {k: _refs(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_refs(v) for v in node]
    return node


def _message(kind: MessageType, name: str, summary: str) -> Schema:
    payload: Schema = (
        {"$ref": f"#/components/schemas/{name}"}
        if MESSAGES[kind][1]
        else {
            "type": "object",
            "description": "The command's own JSON object, as its type's "
            "model reads it (PROTOCOL.md section 5, saga.command).",
        }
    )
    return {
        "name": kind.value,
        "title": name,
        "summary": summary,
        "contentType": "application/json",
        "headers": {
            "type": "object",
            "allOf": [
                {"$ref": "#/components/schemas/Headers"},
                {"properties": {"ce_type": {"const": kind.value}}},
            ],
        },
        "payload": payload,
        "bindings": {
            "kafka": {
                "key": {"type": "string", "description": "The saga id."},
                "bindingVersion": "0.5.0",
            }
        },
    }


def _channels() -> Schema:
    prefix = {"description": "SAGA_KAFKA__TOPIC_PREFIX", "default": "saga"}
    inbox = ("Reply", "Start", "Signal", "Cancel", "Reload", "Undo")
    return {
        "commands": {
            "address": "{prefix}.cmd.{participant}",
            "description": "A participant's commands, keyed by saga id (PROTOCOL.md section 1).",
            "parameters": {
                "prefix": prefix,
                "participant": {"description": "The participant's name."},
            },
            "messages": {"command": {"$ref": "#/components/messages/Command"}},
        },
        "inbox": {
            "address": "{prefix}.inbox",
            "description": "What the engines read: replies, starts, signals, cancels, reloads, undos.",
            "parameters": {"prefix": prefix},
            "messages": {m.lower(): {"$ref": f"#/components/messages/{m}"} for m in inbox},
        },
        "deadLetters": {
            "address": "{prefix}.dlq",
            "description": "Records that can never be processed, with dlq_* headers (section 11).",
            "parameters": {"prefix": prefix},
            "messages": {"deadLetter": {"$ref": "#/components/messages/DeadLetter"}},
        },
        "progress": {
            "address": "{prefix}.progress",
            "description": "Participants' reports on the commands they handle, not durable "
            "(section 5b).",
            "parameters": {"prefix": prefix},
            "messages": {"progress": {"$ref": "#/components/messages/Progress"}},
        },
    }


def _operations() -> Schema:
    def send(channel: str, *messages: str) -> Schema:
        refs = [{"$ref": f"#/channels/{channel}/messages/{m}"} for m in messages]
        return {"action": "send", "channel": {"$ref": f"#/channels/{channel}"}, "messages": refs}

    return {
        "receiveCommand": {
            "action": "receive",
            "channel": {"$ref": "#/channels/commands"},
            "summary": "A participant applies a command once and answers it (section 7).",
            "messages": [{"$ref": "#/channels/commands/messages/command"}],
            "reply": {
                "channel": {"$ref": "#/channels/inbox"},
                "messages": [{"$ref": "#/channels/inbox/messages/reply"}],
            },
        },
        "startSaga": {**send("inbox", "start"), "summary": "A client starts a saga (section 8)."},
        "signalSaga": {**send("inbox", "signal"), "summary": "A client signals a saga."},
        "cancelSaga": {**send("inbox", "cancel"), "summary": "A client cancels a saga."},
        "deadLetter": {
            **send("deadLetters", "deadLetter"),
            "summary": "A participant dead-letters a command it cannot answer (section 7.5).",
        },
        "reportProgress": {
            **send("progress", "progress"),
            "summary": "A participant reports how far it got on a command, fire and forget "
            "(optional; section 5b).",
        },
    }


def build() -> Schema:
    files = gen_schemas.build()
    schemas: dict[str, Schema] = {}
    for file_name, name in _FILE_NAMES.items():
        schemas[name] = _embedded(files[file_name], schemas)
    messages = {
        name: _message(kind, name, summary) for kind, (name, _, summary) in MESSAGES.items()
    }
    messages["DeadLetter"] = {
        "name": "dead-letter",
        "title": "DeadLetter",
        "summary": "The original record (key, value, headers) plus the dlq_* headers.",
        "headers": {"$ref": "#/components/schemas/DeadLetterHeaders"},
    }
    messages["Progress"] = {
        "name": "saga.progress",
        "title": "Progress",
        "summary": "A participant's report on the command it is handling.",
        "contentType": "application/json",
        "payload": {"$ref": "#/components/schemas/StepProgress"},
        "bindings": {
            "kafka": {
                "key": {"type": "string", "description": "The saga id."},
                "bindingVersion": "0.5.0",
            }
        },
    }
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "saga-engine wire protocol",
            "version": SCHEMA_VERSION,
            "description": "Commands, replies and requests between saga-engine and the services "
            "that take part in its sagas. The specification is proto/PROTOCOL.md; this "
            "document is generated from the same models as proto/schemas/.",
        },
        "defaultContentType": "application/json",
        "channels": _channels(),
        "operations": _operations(),
        "components": {"messages": messages, "schemas": dict(sorted(schemas.items()))},
    }


def rendered() -> str:
    return json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if it drifted")
    args = parser.parse_args(argv)
    where = TARGET.relative_to(ROOT)
    current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
    if args.check:
        if current != rendered():
            print(f"{where} is out of date: run `python scripts/gen_asyncapi.py`", file=sys.stderr)
            return 1
        print(f"{where}: up to date")
        return 0
    if current != rendered():
        TARGET.write_text(rendered(), encoding="utf-8", newline="\n")
        print(f"wrote {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The wire contracts in proto/: the schemas match the code, real messages match the
schemas, and PROTOCOL.md keeps up with the headers, message types and poison reasons."""

from __future__ import annotations

import importlib.util
import json
import re
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel
from pydantic import ValidationError as ModelError
from referencing import Registry, Resource

from saga_engine.protocol import (
    CODEC_HEADER,
    HEADERS,
    REQUIRED_HEADERS,
    CancelBody,
    Envelope,
    Headers,
    MessageType,
    PoisonMessage,
    PoisonReason,
    ReplyBody,
    SignalBody,
    StartBody,
    Topics,
    command_id_for,
    decode,
    encode,
    partition_for,
    saga_id_for,
)

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"
SCHEMAS = PROTO / "schemas"
PROTOCOL = PROTO / "PROTOCOL.md"
MAX_BYTES = 1_000_000


def _load_generator() -> ModuleType:
    """scripts/ is not a package: load the generator from its file."""
    path = ROOT / "scripts" / "gen_schemas.py"
    spec = importlib.util.spec_from_file_location("gen_schemas", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_schemas = _load_generator()

BODY_FILES: dict[MessageType, str] = {
    MessageType.REPLY: "reply.schema.json",
    MessageType.START: "start.schema.json",
    MessageType.SIGNAL: "signal.schema.json",
    MessageType.CANCEL: "cancel.schema.json",
    MessageType.RELOAD: "reload.schema.json",
    MessageType.UNDO: "undo.schema.json",
}
BODY_MODELS: dict[MessageType, type[BaseModel]] = {
    MessageType.REPLY: ReplyBody,
    MessageType.START: StartBody,
    MessageType.SIGNAL: SignalBody,
    MessageType.CANCEL: CancelBody,
}


@cache
def committed() -> dict[str, dict[str, Any]]:
    return {
        path.name: json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(SCHEMAS.glob("*.json"))
    }


@cache
def registry() -> Registry[Any]:
    resources = [(schema["$id"], Resource.from_contents(schema)) for schema in committed().values()]
    return Registry().with_resources(resources)


def validator(name: str) -> Draft202012Validator:
    return Draft202012Validator(committed()[name], registry=registry())


def errors(name: str, instance: Any) -> list[str]:
    return [e.message for e in validator(name).iter_errors(instance)]


# --------------------------------------------------------------------------- (a) drift


def test_committed_schemas_match_the_models() -> None:
    problems = gen_schemas.drift(SCHEMAS)
    assert not problems, (
        "proto/schemas/ is out of date with saga_engine/transport/_wire.py: "
        + "; ".join(problems)
        + ". Run `python scripts/gen_schemas.py` and commit the result."
    )


def test_generation_is_deterministic() -> None:
    assert gen_schemas.rendered() == gen_schemas.rendered()
    for name, text in gen_schemas.rendered().items():
        assert text.endswith("}\n"), name
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n", name


def test_check_mode_reports_drift(tmp_path: Path) -> None:
    gen_schemas.write(tmp_path)
    assert gen_schemas.drift(tmp_path) == []
    (tmp_path / "reply.schema.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "start.schema.json").unlink()
    (tmp_path / "old.schema.json").write_text("{}\n", encoding="utf-8")
    assert gen_schemas.drift(tmp_path) == [
        "reply.schema.json: differs from the models",
        "start.schema.json: missing",
        "old.schema.json: not generated any more (delete it)",
    ]
    assert sorted(gen_schemas.write(tmp_path)) == ["reply.schema.json", "start.schema.json"]


# --------------------------------------------------------------------------- (b) valid schemas


def test_the_expected_schema_files_are_committed() -> None:
    assert sorted(committed()) == sorted(
        [
            "envelope.schema.json",
            "headers.schema.json",
            "dlq-headers.schema.json",
            "encoded-value.schema.json",
            "progress.schema.json",
            *BODY_FILES.values(),
        ]
    )


@pytest.mark.parametrize("name", sorted(gen_schemas.build()))
def test_every_schema_is_valid_draft_2020_12(name: str) -> None:
    schema = committed()[name]
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"https://saga-engine.dev/proto/v1/{name}"
    assert schema["title"]
    assert schema["description"]
    for example in schema.get("examples", []):
        assert errors(name, example) == [], example


def test_envelope_names_the_header_of_every_field() -> None:
    properties = committed()["envelope.schema.json"]["properties"]
    assert {f: p["x-kafka-header"] for f, p in properties.items() if f != "body"} == HEADERS
    assert properties["body"]["x-kafka-value"] is True
    assert properties["saga_id"]["x-kafka-key"] is True


def test_header_schemas_follow_the_code() -> None:
    headers = committed()["headers.schema.json"]
    assert set(headers["required"]) == {*REQUIRED_HEADERS, "ce_specversion", "content-type"}
    assert set(headers["properties"]) == {
        *HEADERS.values(),
        "ce_specversion",
        "content-type",
        CODEC_HEADER,
    }
    assert headers["properties"]["ce_type"]["enum"] == [t.value for t in MessageType]
    dlq = committed()["dlq-headers.schema.json"]
    reasons = dlq["properties"]["dlq_reason"]["enum"]
    assert reasons == [r.value for r in PoisonReason]
    assert "engine_error" in reasons


# --------------------------------------------------------------------------- (c) real messages

SAGA_ID = saga_id_for("checkout", "order-42")
TOPICS = Topics("saga")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def command(*, compensation: bool = False) -> Envelope:
    """A command exactly as KafkaCommandSender builds it."""
    command_id = command_id_for(SAGA_ID, "reserve-stock", 0, compensation=compensation)
    return Envelope(
        message_type=MessageType.COMMAND,
        source="/saga-engine/engine-1",
        subject="ReleaseStock" if compensation else "ReserveStock",
        saga_id=SAGA_ID,
        saga_type="checkout",
        command_id=command_id,
        step="reserve-stock",
        correlation_id=SAGA_ID,
        causation_id=command_id,
        reply_to=TOPICS.inbox,
        compensation=compensation,
        compensates=(
            command_id_for(SAGA_ID, "reserve-stock", 0, compensation=False) if compensation else ""
        ),
        traceparent=TRACEPARENT,
        tracestate="congo=t61rcWkgMzE",
        sent_time="2025-01-31T12:00:00.124012Z",
        body={"order_id": "o-42", "sku": "A-1", "quantity": 2},
    )


def reply_to(cmd: Envelope, body: ReplyBody) -> Envelope:
    """A reply as PROTOCOL.md section 7.4 says to build it, with the timing headers of
    section 7.4a."""
    return Envelope(
        message_type=MessageType.REPLY,
        source="/participants/inventory",
        saga_id=cmd.saga_id,
        command_id=cmd.command_id,
        causation_id=cmd.id,
        correlation_id=cmd.correlation_id,
        traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01",
        sent_time=cmd.sent_time,
        received_time="2025-01-31T12:00:00.126530Z",
        handler_start_time="2025-01-31T12:00:00.127104Z",
        handler_end_time="2025-01-31T12:00:00.131877Z",
        commit_time="2025-01-31T12:00:00.133260Z",
        handler_cpu_ms="1.842",
        body=body.model_dump(mode="json"),
    )


def messages() -> list[tuple[str, Envelope]]:
    """One of every kind, as the engine, the client and a participant send them."""
    cmd = command()
    return [
        ("command", cmd),
        ("compensation", command(compensation=True)),
        ("reply-success", reply_to(cmd, ReplyBody(outcome="success", payload={"r": "r-1"}))),
        ("reply-failure", reply_to(cmd, ReplyBody(outcome="failure", error="out of stock"))),
        ("reply-retryable", reply_to(cmd, ReplyBody(outcome="retryable", error="db down"))),
        (
            "start",
            Envelope(
                message_type=MessageType.START,
                source="/saga-client",
                subject="checkout",
                saga_id=SAGA_ID,
                saga_type="checkout",
                correlation_id=SAGA_ID,
                traceparent=TRACEPARENT,
                body=StartBody(
                    input={"order_id": "o-42"}, idempotency_key="order-42", deadline_s=600
                ).model_dump(mode="json"),
            ),
        ),
        (
            "signal",
            Envelope(
                message_type=MessageType.SIGNAL,
                source="/saga-client",
                subject="approval",
                saga_id=SAGA_ID,
                correlation_id=SAGA_ID,
                body=SignalBody(
                    name="approval", signal_id="approval-o-42", payload={"ok": True}
                ).model_dump(mode="json"),
            ),
        ),
        (
            "cancel",
            Envelope(
                message_type=MessageType.CANCEL,
                source="/saga-client",
                saga_id=SAGA_ID,
                correlation_id=SAGA_ID,
                body=CancelBody(reason="customer cancelled").model_dump(mode="json"),
            ),
        ),
    ]


def header_dict(headers: Headers) -> dict[str, str]:
    names = [name for name, _ in headers]
    assert len(names) == len(set(names)), f"a header is repeated: {names}"
    return {name: value.decode() for name, value in headers}


@pytest.mark.parametrize(("label", "envelope"), messages(), ids=[m[0] for m in messages()])
def test_encoded_messages_validate(label: str, envelope: Envelope) -> None:
    key, value, headers = encode(envelope)
    found = header_dict(headers)
    assert errors("headers.schema.json", found) == []
    assert key.decode() == found["ce_sagaid"]
    body = orjson.loads(value)
    if envelope.message_type in BODY_FILES:
        assert errors(BODY_FILES[envelope.message_type], body) == []
    else:
        assert isinstance(body, dict)
    decoded = decode(key, value, headers, max_bytes=MAX_BYTES)
    assert decoded == envelope
    assert errors("envelope.schema.json", decoded.model_dump(mode="json")) == []


def test_every_header_is_exercised() -> None:
    seen: set[str] = set()
    for _, envelope in messages():
        seen |= set(header_dict(encode(envelope)[2]))
    assert seen == {*HEADERS.values(), "ce_specversion", "content-type"}


INVALID_BODIES: list[tuple[MessageType, dict[str, Any]]] = [
    (MessageType.REPLY, {"outcome": "maybe"}),
    (MessageType.REPLY, {}),
    (MessageType.REPLY, {"outcome": "success", "payload": []}),
    (MessageType.REPLY, {"outcome": "success", "extra": 1}),
    (MessageType.REPLY, {"outcome": "failure", "error": 42}),
    (MessageType.START, {"idempotency_key": "k"}),
    (MessageType.START, {"input": "not an object"}),
    (MessageType.START, {"input": {}, "deadline_s": 0}),
    (MessageType.SIGNAL, {"name": "", "signal_id": "s-1"}),
    (MessageType.SIGNAL, {"name": "approval"}),
    (MessageType.SIGNAL, {"name": "approval", "signal_id": "x" * 201}),
    (MessageType.CANCEL, {}),
    (MessageType.CANCEL, {"reason": "x" * 2001}),
    (MessageType.CANCEL, {"reason": "r", "principal": None}),
]


@pytest.mark.parametrize(("kind", "body"), INVALID_BODIES)
def test_invalid_bodies_fail_the_schema_and_the_model(
    kind: MessageType, body: dict[str, Any]
) -> None:
    assert errors(BODY_FILES[kind], body), f"{body} should not validate"
    # The schema and the model the engine decodes with agree.
    with pytest.raises(ModelError):
        BODY_MODELS[kind].model_validate(body)


def _headers_without(name: str) -> dict[str, str]:
    found = header_dict(encode(reply_to(command(), ReplyBody(outcome="success")))[2])
    found.pop(name)
    return found


def _headers_with(name: str, value: str) -> dict[str, str]:
    found = header_dict(encode(reply_to(command(), ReplyBody(outcome="success")))[2])
    found[name] = value
    return found


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        (_headers_without("ce_sagaid"), PoisonReason.MISSING_HEADER),
        (_headers_without("ce_id"), PoisonReason.MISSING_HEADER),
        (_headers_with("ce_source", ""), PoisonReason.MISSING_HEADER),
        (_headers_with("ce_schemaversion", "2"), PoisonReason.WRONG_SCHEMA_VERSION),
        (_headers_with("ce_type", "saga.other"), PoisonReason.UNKNOWN_TYPE),
        (_headers_with("ce_sagaid", "x" * 201), PoisonReason.MISSING_HEADER),
    ],
)
def test_invalid_headers_fail_the_schema_and_the_decoder(
    headers: dict[str, str], reason: PoisonReason
) -> None:
    assert errors("headers.schema.json", headers)
    raw = [(k, v.encode()) for k, v in headers.items()]
    with pytest.raises(PoisonMessage) as caught:
        decode(None, b"{}", raw, max_bytes=MAX_BYTES)
    assert caught.value.reason is reason


@pytest.mark.parametrize(
    "headers",
    [
        _headers_without("ce_specversion"),
        _headers_without("content-type"),
        _headers_without("ce_commandid"),  # a reply the engine cannot match
        _headers_with("ce_specversion", "0.3"),
        _headers_with("content-type", "text/plain"),
        _headers_with("ce_compensation", "yes"),
    ],
)
def test_the_header_schema_is_the_stricter_contract(headers: dict[str, str]) -> None:
    assert errors("headers.schema.json", headers)


def test_unknown_headers_are_allowed_and_ignored() -> None:
    cmd = command()
    key, value, headers = encode(cmd)
    extra = [*headers, ("x-tenant", b"acme")]
    assert errors("headers.schema.json", header_dict(extra)) == []
    assert decode(key, value, extra, max_bytes=MAX_BYTES) == cmd


def test_a_start_must_name_its_saga_type() -> None:
    start = dict(messages())["start"]
    found = header_dict(encode(start)[2])
    for name in ("ce_sagatype", "ce_subject"):
        assert errors("headers.schema.json", {k: v for k, v in found.items() if k != name}) == []
    bare = {k: v for k, v in found.items() if k not in ("ce_sagatype", "ce_subject")}
    assert errors("headers.schema.json", bare)


def test_envelope_schema_checks_the_body_by_type() -> None:
    reply = reply_to(command(), ReplyBody(outcome="success")).model_dump(mode="json")
    assert errors("envelope.schema.json", reply) == []
    assert errors("envelope.schema.json", {**reply, "body": {"outcome": "maybe"}})
    assert errors("envelope.schema.json", {**reply, "schema_version": "2"})
    assert errors("envelope.schema.json", {k: v for k, v in reply.items() if k != "saga_id"})


# --------------------------------------------------------------------------- (d) PROTOCOL.md


@cache
def protocol() -> str:
    return PROTOCOL.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "term",
    [
        *HEADERS.values(),
        "ce_specversion",
        "content-type",
        *(t.value for t in MessageType),
        *(r.value for r in PoisonReason),
        "engine_error",
        *gen_schemas.DLQ_HEADERS,
        CODEC_HEADER,
        "$codec",
    ],
)
def test_protocol_mentions(term: str) -> None:
    assert f"`{term}`" in protocol(), f"proto/PROTOCOL.md never mentions `{term}`"


def test_protocol_mentions_every_schema_file() -> None:
    for name in committed():
        assert f"schemas/{name}" in protocol(), name


def test_protocol_names_the_topics_the_code_uses() -> None:
    topics = Topics("{prefix}")
    for name in (topics.inbox, topics.dlq, topics.progress, topics.commands("{participant}")):
        assert f"`{name}`" in protocol(), name
    assert f"`{topics.participant_group('{participant}')}`" in protocol()


def _table_after(marker: str) -> list[list[str]]:
    """The rows of the markdown table that follows an HTML comment marker."""
    lines = protocol().split(f"<!-- {marker} -->\n", 1)[1].splitlines()
    rows = []
    for line in lines[2:]:  # skip the header and the separator
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    assert rows, f"no table after <!-- {marker} -->"
    return rows


def test_protocol_partition_vectors_match_the_partitioner() -> None:
    for key, *partitions in _table_after("partition-vectors"):
        assert [int(p) for p in partitions] == [partition_for(key, n) for n in (3, 8, 12)], key


def test_protocol_command_id_vectors_match_the_code() -> None:
    saga_id = saga_id_for("checkout", "order-42")
    assert saga_id in protocol()
    for role, generation, command_id in _table_after("command-id-vectors"):
        expected = command_id_for(
            saga_id, "reserve-stock", int(generation), compensation=role == "compensate"
        )
        assert command_id == expected, (role, generation)


def _examples() -> list[tuple[str, str]]:
    found = re.findall(r"<!-- schema: (\S+) -->\n```json\n(.*?)\n```", protocol(), re.S)
    return [(name, text) for name, text in found]


@pytest.mark.parametrize(("name", "text"), _examples())
def test_protocol_examples_validate(name: str, text: str) -> None:
    assert errors(name, json.loads(text)) == []


def test_protocol_has_examples_of_every_body_and_both_header_sets() -> None:
    names = [name for name, _ in _examples()]
    assert set(BODY_FILES.values()) <= set(names)
    assert names.count("headers.schema.json") >= 2


def test_protocol_example_ids_are_real() -> None:
    for name, text in _examples():
        if name != "headers.schema.json":
            continue
        headers = json.loads(text)
        assert headers["ce_sagaid"] == saga_id_for("checkout", "order-42")
        assert headers["ce_commandid"] == command_id_for(
            headers["ce_sagaid"], "reserve-stock", 0, compensation=False
        )


def test_limits_quoted_in_protocol_match_the_code() -> None:
    from saga_engine.settings import EngineSettings, KafkaSettings

    assert f"({KafkaSettings().max_message_bytes:,} bytes)" in protocol()
    # One size limit: no second, lower one for payloads.
    assert "max_payload_bytes" not in EngineSettings.model_fields
    assert "MAX_PAYLOAD_BYTES" not in protocol()
    assert "`ce_schemaversion: 1`" in protocol()


# ----------------------------------------------------- (e) every MUST has a conformance row

RULE_ID = r"M\d+(?:\.\d+)?-\d+"
#: A MUST or MUST NOT, or the id that names the rule it states: ``[M7.5-1]``.
MUST_OR_ID = re.compile(rf"\bMUST(?: NOT)?\b|\[({RULE_ID})\]")
RULES_HEADING = "**Every MUST and what checks it.**"


def _rules_text() -> str:
    """PROTOCOL.md up to section 16's rules table, BCP 14's key-word paragraph blanked."""
    text = protocol()
    start = text.index("The key words MUST")
    end = text.index("\n\n", start)
    # Blanked, not cut: line numbers stay the file's.
    text = text[:start] + "\n" * text.count("\n", start, end) + text[end:]
    return text[: text.index(RULES_HEADING)]


def _rules_table() -> dict[str, str]:
    """Section 16's table: rule id to the cell naming its cases (or why none can)."""
    rows = protocol().split("<!-- rules -->\n", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    table: dict[str, str] = {}
    for row in rows:
        rule, _what, checked_by = (c.strip() for c in row.strip("|").split(" | "))
        assert rule not in table, f"{rule} has two rows"
        table[rule] = checked_by
    return table


def _stated_rules() -> list[str]:
    """The id of every MUST and MUST NOT, in order; fails at one without its own id."""
    ids: list[str] = []
    pending = 0  # the line of a MUST still waiting for its id
    text = _rules_text()
    for match in MUST_OR_ID.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        if match.group(1) is None:
            assert not pending, f"the MUST at line {pending} has no [M…] id before the next"
            pending = line
            continue
        assert pending, f"[{match.group(1)}] at line {line} follows no MUST"
        ids.append(match.group(1))
        pending = 0
    assert not pending, f"the MUST at line {pending} has no [M…] id"
    return ids


def test_every_must_of_the_protocol_has_its_own_id() -> None:
    ids = _stated_rules()
    assert len(ids) >= 30
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


def test_section_16_maps_every_must_to_a_case_of_the_suite() -> None:
    from saga_engine.conformance import CASE_NAMES

    table = _rules_table()
    assert sorted(table) == sorted(_stated_rules())
    for rule, checked_by in table.items():
        if checked_by.startswith("none: "):
            assert len(checked_by) > 20, f"{rule}: say why no case can check it"
            continue
        cases = re.findall(r"`([^`]+)`", checked_by)
        assert cases, f"{rule}: name a case, or say 'none: why'"
        for case in cases:
            matched = [
                n
                for n in CASE_NAMES
                if n == case or (case.endswith("*") and n.startswith(case[:-1]))
            ]
            assert matched, f"{rule} names {case!r}, which the conformance suite does not have"

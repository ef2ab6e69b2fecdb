"""The engine's commands and the kit's replies are encoded from their fields, without an
``Envelope`` validated for them: the record must be the one the envelope gives."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from saga_engine.transport._wire import (
    Envelope,
    MessageType,
    decode,
    encode,
    encode_fields,
)

_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)


@given(
    subject=_text,
    step=_text,
    compensation=st.booleans(),
    compensates=_text,
    traceparent=_text,
    body=st.dictionaries(_text, st.integers(-(2**63), 2**63 - 1) | _text, max_size=4),
)
def test_a_record_from_fields_is_the_envelopes(
    subject: str,
    step: str,
    compensation: bool,
    compensates: str,
    traceparent: str,
    body: dict[str, object],
) -> None:
    fields: dict[str, Any] = {
        "id": "m-1",
        "time": datetime(2026, 12, 5, 8, 0, tzinfo=UTC),
        "message_type": MessageType.COMMAND,
        "source": "/saga-engine",
        "subject": subject,
        "saga_id": "saga-1",
        "step": step,
        "compensation": compensation,
        "compensates": compensates,
        "traceparent": traceparent,
    }
    envelope = Envelope(**fields, body=body)
    assert encode_fields(fields, body) == encode(envelope)


def test_left_out_fields_take_the_envelopes_defaults() -> None:
    fields: dict[str, Any] = {
        "message_type": MessageType.REPLY,
        "source": "/p",
        "saga_id": "s",
        "command_id": "c",
    }
    key, value, headers = encode_fields(fields, {"outcome": "success"})
    read = decode(key, value, headers, max_bytes=1 << 20)
    assert read.schema_version == "1"
    assert read.compensation is False
    assert read.subject == ""
    assert uuid.UUID(read.id).version == 4
    assert abs((read.time - datetime.now(UTC)).total_seconds()) < 60
    again = decode(*encode_fields(fields, {"outcome": "success"}), max_bytes=1 << 20)
    assert again.id != read.id  # a new message each time


def test_the_order_fields_are_given_in_changes_nothing() -> None:
    fields: dict[str, Any] = {
        "id": "m-1",
        "time": "2026-12-05T08:00:00.000000Z",
        "message_type": MessageType.REPLY,
        "source": "/p",
        "saga_id": "s",
        "command_id": "c",
        "compensation": True,
    }
    backwards = dict(reversed(fields.items()))
    assert list(backwards) != list(fields)
    assert encode_fields(backwards, {}) == encode_fields(fields, {})


@given(first=_text, second=_text)
def test_a_value_is_never_served_from_an_earlier_message(first: str, second: str) -> None:
    # The plan encode_fields keeps per set of field names holds names, never values.
    def record(subject: str, compensation: bool) -> dict[str, bytes]:
        fields: dict[str, Any] = {
            "message_type": MessageType.COMMAND,
            "source": "/saga-engine",
            "subject": subject,
            "saga_id": "saga-1",
            "compensation": compensation,
        }
        return dict(encode_fields(fields, {})[2])

    one, two = record(first, False), record(second, True)
    assert one.get("ce_subject", b"") == first.encode()
    assert two.get("ce_subject", b"") == second.encode()
    assert ("ce_compensation" in one, two["ce_compensation"]) == (False, b"true")
    assert one["ce_id"] != two["ce_id"]


def test_a_value_given_as_bytes_is_its_header() -> None:
    fields: dict[str, Any] = {
        "id": b"m-1",
        "time": b"2026-12-05T08:00:00.000000Z",
        "message_type": MessageType.REPLY,
        "source": "/p",
        "saga_id": "s",
        "command_id": b"",
        "not_a_field": "ignored, as before",
    }
    headers = dict(encode_fields(fields, {})[2])
    assert headers["ce_id"] == b"m-1"
    assert headers["ce_time"] == b"2026-12-05T08:00:00.000000Z"
    assert "ce_commandid" not in headers
    assert b"ignored, as before" not in headers.values()


def test_the_time_made_is_now_in_utc() -> None:
    fields: dict[str, Any] = {"message_type": MessageType.REPLY, "source": "/p", "saga_id": "s"}
    before = datetime.now(UTC)
    text = dict(encode_fields(fields, {})[2])["ce_time"].decode()
    assert text.endswith("Z")
    assert before <= datetime.fromisoformat(text) <= datetime.now(UTC)

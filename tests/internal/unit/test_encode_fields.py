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

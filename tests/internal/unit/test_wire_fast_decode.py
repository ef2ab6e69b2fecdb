"""``decode`` builds the envelope without validating again what its header checks did
(``_fast_envelope``), and leaves to ``Envelope.model_validate`` whatever validation
could refuse: the envelope is the one validation makes, to the order of its fields and
the fields it records as set, and every refusal says what it said."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from saga_engine.kernel._errors import PoisonMessage, PoisonReason
from saga_engine.transport._wire import (
    HEADERS,
    Envelope,
    Headers,
    MessageType,
    _fast_envelope,
    _validated_envelope,
    decode,
    encode,
)

MAX = 1_000_000


def _record(**fields: Any) -> tuple[bytes, bytes, Headers]:
    base: dict[str, Any] = {
        "message_type": MessageType.REPLY,
        "source": "/participants/p",
        "subject": "Debit",
        "saga_id": "s-1",
        "saga_type": "order",
        "command_id": "c-1",
        "step": "debit",
        "correlation_id": "s-1",
        "causation_id": "m-1",
        "compensation": True,
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "sent_time": "2026-12-07T19:30:29.670696Z",
        "body": {"outcome": "success", "payload": {"n": 1}},
    }
    return encode(Envelope(**{**base, **fields}))


def _fields(headers: Headers) -> dict[str, str]:
    field_of = {h: f for f, h in HEADERS.items()}
    return {field_of[n]: v.decode() for n, v in headers if n in field_of}


def _same(fast: Envelope, validated: Envelope) -> None:
    assert list(fast.__dict__) == list(validated.__dict__) == [*HEADERS, "body"]
    assert fast.__dict__ == validated.__dict__
    assert fast.model_fields_set == validated.model_fields_set
    assert type(fast.time.tzinfo) is type(validated.time.tzinfo)
    assert fast.model_dump_json() == validated.model_dump_json()
    assert fast == validated


@pytest.mark.parametrize("message_type", list(MessageType))
def test_the_fast_envelope_is_the_validated_one(message_type: MessageType) -> None:
    key, value, headers = _record(message_type=message_type)
    fields = _fields(headers)
    fast = _fast_envelope(dict(fields), {"a": 1})
    assert fast is not None
    _same(fast, _validated_envelope(dict(fields), {"a": 1}))
    decoded = decode(key, value, headers, max_bytes=MAX)
    _same(decoded, _validated_envelope(fields, decoded.body))


def test_an_envelope_at_its_defaults_is_the_validated_one() -> None:
    _, _, headers = _record(compensation=False, traceparent="", sent_time="", step="")
    fields = _fields(headers)
    assert "compensation" not in fields
    assert "step" not in fields
    fast = _fast_envelope(dict(fields), {})
    assert fast is not None
    assert not fast.compensation
    _same(fast, _validated_envelope(fields, {}))


def test_compensation_is_true_only_for_true() -> None:
    key, value, headers = _record()
    headers = [(n, b"yes" if n == "ce_compensation" else v) for n, v in headers]
    # pydantic would read "yes" as true; the wire reads only "true" so.
    assert decode(key, value, headers, max_bytes=MAX).compensation is False


def test_a_saga_id_too_long_is_refused_as_validation_refuses_it() -> None:
    saga_id = "s" * 201
    _, value, headers = _record(saga_id="s")
    headers = [(n, saga_id.encode() if n == "ce_sagaid" else v) for n, v in headers]
    with pytest.raises(PoisonMessage) as caught:
        decode(saga_id.encode(), value, headers, max_bytes=MAX)
    assert caught.value.reason is PoisonReason.MISSING_HEADER
    assert "bad header values: 1 validation error for Envelope\nsaga_id" in str(caught.value)
    ok = [(n, b"s" * 200 if n == "ce_sagaid" else v) for n, v in headers]
    assert decode(b"s" * 200, value, ok, max_bytes=MAX).saga_id == "s" * 200


@pytest.mark.parametrize("time", [b"", b"yesterday", b"2026-13-07T19:30:29Z"])
def test_a_time_that_is_not_one_is_refused_as_validation_refuses_it(time: bytes) -> None:
    key, value, headers = _record()
    headers = [(n, time if n == "ce_time" else v) for n, v in headers]
    with pytest.raises(PoisonMessage, match=r"bad header values: .*\ntime") as caught:
        decode(key, value, headers, max_bytes=MAX)
    assert caught.value.reason is PoisonReason.MISSING_HEADER


def test_a_time_validation_takes_is_taken_as_it_does() -> None:
    # A number of seconds is a time to pydantic: the fast path reads it with its validator.
    key, value, headers = _record()
    headers = [(n, b"1765000000" if n == "ce_time" else v) for n, v in headers]
    envelope = decode(key, value, headers, max_bytes=MAX)
    assert envelope.time == datetime.fromtimestamp(1_765_000_000, UTC)
    _same(envelope, _validated_envelope(_fields(headers), envelope.body))


def test_without_a_time_the_envelope_is_stamped_now() -> None:
    key, value, headers = _record()
    before = datetime.now(UTC)
    envelope = decode(key, value, [h for h in headers if h[0] != "ce_time"], max_bytes=MAX)
    assert envelope.time >= before
    assert "time" not in envelope.model_fields_set


def test_a_header_given_twice_is_read_last() -> None:
    key, value, headers = _record()
    envelope = decode(key, value, [*headers, ("ce_subject", b"Credit")], max_bytes=MAX)
    assert envelope.subject == "Credit"


def test_a_header_named_like_a_field_is_not_the_field() -> None:
    key, value, headers = _record()
    extra = [("source", b"/elsewhere"), ("id", b"x"), ("saga_id", b"t"), ("body", b"{}")]
    envelope = decode(key, value, [*headers, *extra], max_bytes=MAX)
    assert (envelope.source, envelope.saga_id) == ("/participants/p", "s-1")
    assert envelope.id == dict(headers)["ce_id"].decode()


def test_a_header_that_is_not_utf8_is_refused_after_the_size() -> None:
    key, value, headers = _record()
    bad = [*headers, ("ce_step", b"\xff\xfe")]
    with pytest.raises(PoisonMessage, match="header ce_step is not UTF-8"):
        decode(key, value, bad, max_bytes=MAX)
    with pytest.raises(PoisonMessage) as caught:
        decode(key, value, bad, max_bytes=len(value))
    assert caught.value.reason is PoisonReason.OVERSIZED


def test_an_empty_or_null_header_value_counts_as_missing() -> None:
    key, value, headers = _record()
    for empty in (b"", None):
        cut = [(n, empty if n == "ce_source" else v) for n, v in headers]
        with pytest.raises(PoisonMessage, match=r"missing header\(s\): ce_source"):
            decode(key, value, cut, max_bytes=MAX)  # type: ignore[arg-type]


def test_the_fast_envelope_knows_every_constraint_of_the_model() -> None:
    """``_fast_envelope`` checks the saga id's length and the time, and takes every other
    field's text as it is: a constraint or validator added to ``Envelope`` must be taught
    to it (or left to ``model_validate``) before this passes again."""
    constrained = {
        name: [repr(m) for m in field.metadata]
        for name, field in Envelope.model_fields.items()
        if field.metadata
    }
    assert constrained == {"saga_id": ["MinLen(min_length=1)", "MaxLen(max_length=200)"]}
    decorators = Envelope.__pydantic_decorators__
    assert not decorators.field_validators
    assert not decorators.model_validators
    assert not decorators.validators
    assert {name: field.annotation for name, field in Envelope.model_fields.items()} == {
        name: str for name in HEADERS if name not in ("message_type", "time", "compensation")
    } | {
        "message_type": MessageType,
        "time": datetime,
        "compensation": bool,
        "body": Any,
    }

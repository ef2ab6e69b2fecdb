"""Payload codecs: round trips, key rotation, the clear errors, the threshold, the
stored-event seal and the wire marker (issue 14 section 4)."""

from __future__ import annotations

import base64
import os
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from saga_engine.core.history._codec import (
    ENCRYPTED,
    HEADER,
    MARKER,
    AesGcmCodec,
    CodecChain,
    GzipCodec,
    NoopCodec,
    PayloadCodec,
    Undecodable,
    ZstdCodec,
    open_event,
    seal_event,
)
from saga_engine.core.history._events import (
    CommandIssued,
    CompensationSpec,
    Event,
    SagaStarted,
    SideEffectRecorded,
    TimerFired,
    event_to_dict,
)
from saga_engine.core.history._policy import RetryPolicy
from saga_engine.core.history._structs import InvalidRecord
from saga_engine.kernel._errors import (
    CodecError,
    CodecFailure,
    PoisonMessage,
    PoisonReason,
)
from saga_engine.kernel._settings import CodecSettings, Settings
from saga_engine.transport._wire import (
    Envelope,
    MessageType,
    ReplyBody,
    decode,
    encode,
)

KEY_A = bytes(range(32))
KEY_B = bytes(range(1, 33))
NOW = datetime(2026, 1, 1, tzinfo=UTC)
CANARY = "canary-4f1c-personal-data"


def aes(current: str = "a", **keys: bytes) -> AesGcmCodec:
    return AesGcmCodec(keys or {"a": KEY_A}, current)


# --------------------------------------------------------------------------- AES-GCM


def test_aes_round_trip_and_layout() -> None:
    codec = aes()
    encoded = codec.encode(b"hello " + CANARY.encode())
    assert CANARY.encode() not in encoded
    # version 1, key id length 1, key id "a", 12-byte nonce, ciphertext, 16-byte tag
    assert encoded[:3] == b"\x01\x01a"
    assert len(encoded) == 3 + 12 + len(b"hello " + CANARY.encode()) + 16
    assert codec.decode(encoded) == b"hello " + CANARY.encode()
    assert AesGcmCodec.key_id_of(encoded) == "a"


def test_aes_nonce_is_random_per_payload() -> None:
    codec = aes()
    assert codec.encode(b"same") != codec.encode(b"same")


def test_rotation_old_key_still_decodes_new_payloads_use_the_current_key() -> None:
    old = aes("a", a=KEY_A)
    written_before = old.encode(b"old payload")
    rotated = aes("b", a=KEY_A, b=KEY_B)
    assert rotated.decode(written_before) == b"old payload"
    fresh = rotated.encode(b"new payload")
    assert AesGcmCodec.key_id_of(fresh) == "b"
    # The old process cannot read the new key's payloads, and says which key it lacks.
    with pytest.raises(CodecError) as caught:
        old.decode(fresh)
    assert caught.value.failure is CodecFailure.UNKNOWN_KEY
    assert caught.value.key_id == "b"
    assert "'b'" in str(caught.value)


def test_tampered_ciphertext_fails_the_tag() -> None:
    codec = aes()
    encoded = bytearray(codec.encode(b"pay me 10"))
    encoded[-20] ^= 0x01
    with pytest.raises(CodecError) as caught:
        codec.decode(bytes(encoded))
    assert caught.value.failure is CodecFailure.TAMPERED


def test_a_swapped_key_id_fails_the_tag() -> None:
    # Both ids known, but the payload was encrypted under a: the key id is associated
    # data, so relabelling it as b cannot pass.
    codec = aes("a", a=KEY_A, b=KEY_B)
    encoded = bytearray(codec.encode(b"x"))
    encoded[2] = ord("b")
    with pytest.raises(CodecError) as caught:
        codec.decode(bytes(encoded))
    assert caught.value.failure is CodecFailure.TAMPERED


@pytest.mark.parametrize("data", [b"", b"\x02\x01a", b"\x01\x05ab", b"\x01\x01a" + b"n" * 12])
def test_malformed_payloads_are_refused(data: bytes) -> None:
    with pytest.raises(CodecError) as caught:
        aes().decode(data)
    assert caught.value.failure is CodecFailure.MALFORMED


def test_bad_keys_are_refused() -> None:
    with pytest.raises(CodecError, match="16, 24 or 32"):
        AesGcmCodec({"a": b"short"}, "a")
    with pytest.raises(CodecError, match="not among the keys"):
        AesGcmCodec({"a": KEY_A}, "b")
    with pytest.raises(CodecError, match="key id"):
        AesGcmCodec({"a b": KEY_A}, "a b")


# --------------------------------------------------------------------------- compression


@pytest.mark.parametrize("cls", [ZstdCodec, GzipCodec])
def test_compression_only_above_the_threshold_and_marks_it(cls: type[ZstdCodec]) -> None:
    codec = cls(threshold=100)
    small = b"a" * 99
    assert codec.encode(small) == b"\x00" + small
    large = b"a" * 1000
    packed = codec.encode(large)
    assert packed[0] == 1
    assert len(packed) < 100
    assert codec.decode(packed) == large
    assert codec.decode(codec.encode(small)) == small


@pytest.mark.parametrize("cls", [ZstdCodec, GzipCodec])
def test_incompressible_payloads_stay_raw(cls: type[ZstdCodec]) -> None:
    noise = os.urandom(4096)
    assert cls(threshold=0).encode(noise) == b"\x00" + noise


@pytest.mark.parametrize("cls", [ZstdCodec, GzipCodec])
def test_compression_refuses_garbage(cls: type[ZstdCodec]) -> None:
    with pytest.raises(CodecError) as caught:
        cls().decode(b"\x01not compressed")
    assert caught.value.failure is CodecFailure.MALFORMED
    with pytest.raises(CodecError):
        cls().decode(b"\x07")


# --------------------------------------------------------------------------- chain


def test_chain_compresses_before_encrypting() -> None:
    chain = CodecChain(ZstdCodec(threshold=10), aes())
    assert chain.name == "zstd,aes-gcm"
    data = b'{"text": "' + b"repeat " * 200 + b'"}'
    encoded = chain.encode(data)
    assert len(encoded) < len(data) // 4  # compressed first: ciphertext would not shrink
    assert chain.decode(encoded) == data


def test_chain_decodes_by_the_marker_so_turning_compression_on_keeps_old_payloads() -> None:
    before = CodecChain(aes())
    marker = before.seal({"x": 1})
    after = CodecChain(ZstdCodec(), aes())
    assert after.open(marker) == {"x": 1}
    with pytest.raises(CodecError) as caught:
        CodecChain(aes()).open(CodecChain(GzipCodec(), aes()).seal({"x": 1}))
    assert caught.value.failure is CodecFailure.UNKNOWN_CODEC


def test_chain_refuses_duplicate_or_comma_names() -> None:
    with pytest.raises(CodecError):
        CodecChain(NoopCodec(), NoopCodec())
    with pytest.raises(CodecError):
        CodecChain()


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=5000),
    threshold=st.integers(min_value=0, max_value=2000),
    compression=st.sampled_from(["zstd", "gzip", "none"]),
)
def test_property_decode_after_encode_is_identity(
    data: bytes, threshold: int, compression: str
) -> None:
    codecs: dict[str, list[PayloadCodec]] = {
        "zstd": [ZstdCodec(threshold)],
        "gzip": [GzipCodec(threshold)],
        "none": [],
    }
    chain = CodecChain(*codecs[compression], aes())
    assert chain.decode(chain.encode(data)) == data


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(value=json_values)
def test_property_open_after_seal_is_identity(value: object) -> None:
    chain = CodecChain(ZstdCodec(threshold=20), aes())
    marker = chain.seal(value)
    assert set(marker) == {MARKER, "data"}
    assert chain.open(marker) == value


# --------------------------------------------------------------------------- events


def _command() -> CommandIssued:
    return CommandIssued(
        at=NOW,
        step="charge",
        participant="payments",
        command_type="Charge",
        payload={"card": CANARY},
        payload_hash="h" * 32,
        command_id="c-1",
        attempt=1,
        compensation=CompensationSpec(
            participant="payments",
            command_type="Refund",
            payload={"card": CANARY},
            retry=RetryPolicy(),
        ),
    )


def test_sealed_events_hide_payloads_and_round_trip() -> None:
    chain = CodecChain(aes())
    events: list[Event] = [
        SagaStarted(at=NOW, saga_type="T", input={"name": CANARY}),
        _command(),
        SideEffectRecorded(at=NOW, op_id="s", value=CANARY),
    ]
    for event in events:
        sealed = seal_event(chain, event_to_dict(event))
        assert CANARY not in str(sealed)
        assert sealed["kind"] == event.kind
        assert open_event(chain, sealed) == event


def test_events_without_payloads_are_not_marked() -> None:
    event = TimerFired(at=NOW, timer_id="t")
    assert MARKER not in seal_event(CodecChain(aes()), event_to_dict(event))


def test_a_clear_history_reads_with_a_codec_configured() -> None:
    event = SagaStarted(at=NOW, saga_type="T", input={"name": "clear"})
    assert open_event(CodecChain(aes()), event_to_dict(event)) == event


def test_a_sealed_event_without_a_codec_fails_clearly() -> None:
    sealed = seal_event(CodecChain(aes()), event_to_dict(_command()))
    with pytest.raises(CodecError) as caught:
        open_event(None, dict(sealed))
    assert caught.value.failure is CodecFailure.NOT_CONFIGURED
    assert "command_issued" in str(caught.value)


def test_a_sealed_event_without_its_key_fails_clearly_or_shows_encrypted() -> None:
    sealed = seal_event(CodecChain(aes("b", b=KEY_B)), event_to_dict(_command()))
    other = CodecChain(aes())
    with pytest.raises(CodecError) as caught:
        open_event(other, dict(sealed))
    assert caught.value.failure is CodecFailure.UNKNOWN_KEY
    shown = open_event(other, dict(sealed), Undecodable.SHOW)
    assert isinstance(shown, CommandIssued)
    assert shown.payload == {
        ENCRYPTED: {"failure": "unknown_key", "codec": "aes-gcm", "key_id": "b"}
    }
    assert shown.compensation is not None
    assert shown.compensation.payload[ENCRYPTED]["key_id"] == "b"
    assert shown.step == "charge"  # the event's shape stays readable
    without = open_event(None, dict(sealed), Undecodable.SHOW)
    assert isinstance(without, CommandIssued)
    assert without.payload[ENCRYPTED]["failure"] == "not_configured"


def test_a_clear_event_that_is_invalid_still_raises_its_validation_error() -> None:
    with pytest.raises(InvalidRecord, match="missing required field `at`"):
        open_event(None, {"kind": "saga_started"})


# --------------------------------------------------------------------------- wire


def _start() -> Envelope:
    return Envelope(
        message_type=MessageType.START,
        source="/t",
        saga_id="s-1",
        body={"input": {"name": CANARY}},
    )


def test_wire_seals_the_value_and_marks_it_with_a_header() -> None:
    chain = CodecChain(ZstdCodec(), aes())
    key, value, headers = encode(_start(), chain)
    assert CANARY.encode() not in value
    assert (HEADER, b"zstd,aes-gcm") in headers
    assert value.startswith(b'{"$codec":"zstd,aes-gcm","data":"')
    back = decode(key, value, headers, max_bytes=1_000_000, codec=chain)
    assert back.body == {"input": {"name": CANARY}}


def test_wire_without_a_codec_is_unchanged_and_reads_clear_values_with_one() -> None:
    key, value, headers = encode(_start())
    assert CANARY.encode() in value
    assert all(name != HEADER for name, _ in headers)
    back = decode(key, value, headers, max_bytes=1_000_000, codec=CodecChain(aes()))
    assert back.body["input"]["name"] == CANARY


@pytest.mark.parametrize(
    "reader", [None, CodecChain(aes("b", b=KEY_B))], ids=["no codec", "other key"]
)
def test_wire_undecodable_values_are_poison_with_the_reason(reader: CodecChain | None) -> None:
    key, value, headers = encode(_start(), CodecChain(aes()))
    with pytest.raises(PoisonMessage) as caught:
        decode(key, value, headers, max_bytes=1_000_000, codec=reader)
    assert caught.value.reason is PoisonReason.UNDECODABLE


def test_wire_tampered_value_is_poison() -> None:
    chain = CodecChain(aes())
    key, value, headers = encode(_start(), chain)
    text = value.decode()
    data = text.split('"data":"')[1].rstrip('"}')
    raw = bytearray(base64.b64decode(data))
    raw[-1] ^= 1
    tampered = text.replace(data, base64.b64encode(bytes(raw)).decode()).encode()
    with pytest.raises(PoisonMessage, match="tampered"):
        decode(key, tampered, headers, max_bytes=1_000_000, codec=chain)


# --------------------------------------------------------------------------- settings


def test_settings_build_the_chain() -> None:
    b64 = base64.b64encode(KEY_A).decode()
    assert CodecChain.from_settings(CodecSettings()) is None
    chain = CodecChain.from_settings(
        CodecSettings.model_validate(
            {"keys": {"k1": b64}, "compression": "zstd", "compress_threshold": 10}
        )
    )
    assert chain is not None
    assert chain.name == "zstd,aes-gcm"
    assert chain.decode(chain.encode(b"x" * 100)) == b"x" * 100


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = base64.b64encode(KEY_A).decode(), base64.b64encode(KEY_B).decode()
    monkeypatch.setenv("SAGA_CODEC__KEYS", f'{{"k1": "{old}", "k2": "{new}"}}')
    monkeypatch.setenv("SAGA_CODEC__CURRENT_KEY", "k2")
    monkeypatch.setenv("SAGA_CODEC__COMPRESSION", "gzip")
    chain = CodecChain.from_settings(Settings().codec)
    assert chain is not None
    assert chain.name == "gzip,aes-gcm"
    assert AesGcmCodec.key_id_of(chain.encode(b"x")) == "k2"
    # Settings never echo keys.
    assert old not in repr(Settings())


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"keys": {"a": "AAAA"}}, "AES-GCM takes 16, 24 or 32"),
        ({"keys": {"a": "not base64!"}}, "not base64"),
        ({"keys": {"a": base64.b64encode(KEY_A).decode()}, "current_key": "b"}, "not among"),
        (
            {
                "keys": {
                    "a": base64.b64encode(KEY_A).decode(),
                    "b": base64.b64encode(KEY_B).decode(),
                }
            },
            "current_key",
        ),
    ],
)
def test_bad_codec_settings_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        CodecSettings.model_validate(fields)


def test_a_dead_letters_detail_never_echoes_the_refused_values() -> None:
    # The detail travels in clear (dlq_detail), even when the value came encrypted.
    envelope = Envelope(
        message_type=MessageType.REPLY,
        source="/t",
        saga_id="s-1",
        command_id="c-1",
        body={"outcome": CANARY},
    )
    with pytest.raises(PoisonMessage) as caught:
        envelope.body_as(ReplyBody)
    assert caught.value.reason is PoisonReason.INVALID_BODY
    assert "outcome: Input should be" in caught.value.detail
    assert CANARY not in str(caught.value)


def test_zstd_is_safe_across_threads() -> None:
    # Retention seals archive files in a worker thread while the loop seals payloads.
    from concurrent.futures import ThreadPoolExecutor

    codec = ZstdCodec(threshold=0)
    payloads = [os.urandom(64) * (50 + i) for i in range(40)]

    def round_trip(data: bytes) -> bool:
        return all(codec.decode(codec.encode(data)) == data for _ in range(20))

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(round_trip, payloads))

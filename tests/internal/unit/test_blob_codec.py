"""The ``ref`` codec (payloads stored by reference): round trips, the reference's MAC,
a missing or altered blob, settings, and the dead-letter reasons those failures make."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime

import pytest
from pydantic import SecretStr, ValidationError

from saga_engine.core.history._blobref import ReferenceCodec, collecting, resolving
from saga_engine.core.history._codec import (
    AesGcmCodec,
    CodecChain,
    ZstdCodec,
    open_event,
    seal_event,
)
from saga_engine.core.history._events import SagaStarted, event_to_dict
from saga_engine.kernel._dead_letter_reason import dead_letter_reason
from saga_engine.kernel._errors import CodecError, CodecFailure, PayloadTooLarge
from saga_engine.kernel._poison import PoisonReason
from saga_engine.kernel._settings import Settings, payload_limit
from saga_engine.settings import BlobSettings, CodecSettings

KEY = bytes(range(32))
MAC = b"m" * 32


def ref_chain(threshold: int = 100) -> CodecChain:
    return CodecChain(
        ZstdCodec(threshold=64), AesGcmCodec({"k": KEY}, "k"), ReferenceCodec(threshold, MAC, "t")
    )


def big() -> bytes:
    # Random-looking, so compression does not bring it below the threshold.
    return b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(200))


def test_a_large_payload_round_trips_by_reference() -> None:
    chain = ref_chain()
    with collecting() as blobs:
        encoded = chain.encode(big())
    assert len(blobs) == 1
    ((digest, blob),) = blobs.items()
    assert hashlib.sha256(blob).hexdigest() == digest
    assert len(encoded) < 400  # a reference, not the payload
    with resolving(blobs):
        assert chain.decode(encoded) == big()


def test_a_small_payload_stays_inline_and_needs_no_blob() -> None:
    chain = ref_chain(threshold=10_000)
    with collecting() as blobs:
        encoded = chain.encode(b'{"small": true}')
    assert blobs == {}
    assert chain.decode(encoded) == b'{"small": true}'


def test_where_nothing_collects_a_large_payload_stays_inline() -> None:
    # A Kafka record, an error column: nothing stores blobs there, so no reference.
    chain = ref_chain()
    encoded = chain.encode(big())
    assert chain.decode(encoded) == big()


def test_a_missing_blob_is_a_codec_error_that_names_it() -> None:
    chain = ref_chain()
    with collecting() as blobs:
        encoded = chain.encode(big())
    digest = next(iter(blobs))
    with resolving({}), pytest.raises(CodecError) as caught:
        chain.decode(encoded)
    assert caught.value.failure is CodecFailure.BLOB_MISSING
    assert digest in str(caught.value)
    with pytest.raises(CodecError) as unresolved:
        chain.decode(encoded)  # no resolving context at all
    assert unresolved.value.failure is CodecFailure.BLOB_MISSING


def test_an_altered_blob_is_tampered() -> None:
    chain = ref_chain()
    with collecting() as blobs:
        encoded = chain.encode(big())
    digest, blob = next(iter(blobs.items()))
    altered = bytes([blob[0] ^ 1]) + blob[1:]
    with resolving({digest: altered}), pytest.raises(CodecError) as caught:
        chain.decode(encoded)
    assert caught.value.failure is CodecFailure.BLOB_TAMPERED


def test_a_reference_pointed_at_another_blob_fails_its_mac() -> None:
    codec = ReferenceCodec(10, MAC, "t")
    with collecting() as blobs:
        encoded = codec.encode(b"a" * 50)
        other = codec.encode(b"b" * 50)
    ref = json.loads(encoded[1:])
    ref["sha256"] = json.loads(other[1:])["sha256"]  # a forged reference, its old MAC
    forged = b"\x01" + json.dumps(ref).encode()
    with resolving(blobs), pytest.raises(CodecError) as caught:
        codec.decode(forged)
    assert caught.value.failure is CodecFailure.BLOB_TAMPERED
    wrong_key = ReferenceCodec(10, b"x" * 32, "t")
    with resolving(blobs), pytest.raises(CodecError) as other_key:
        wrong_key.decode(encoded)
    assert other_key.value.failure is CodecFailure.BLOB_TAMPERED


@pytest.mark.parametrize(
    "data",
    [
        b"\x02{}",
        b"\x01not json",
        b"\x01[]",
        b'\x01{"sha256": "ab", "size": 1, "store": "t", "mac": ""}',
    ],
)
def test_a_malformed_reference_is_malformed(data: bytes) -> None:
    with pytest.raises(CodecError) as caught:
        ReferenceCodec(10, MAC, "t").decode(data)
    assert caught.value.failure is CodecFailure.MALFORMED


def test_a_sealed_event_carries_a_reference_and_opens_under_its_blobs() -> None:
    chain = ref_chain()
    text = base64.b64encode(big()).decode()
    started = SagaStarted(at=datetime.now(UTC), saga_type="t", input={"doc": text})
    with collecting() as blobs:
        sealed = seal_event(chain, event_to_dict(started))
    assert len(json.dumps(sealed)) < 1000 < len(text)
    with resolving(blobs):
        assert open_event(chain, json.loads(json.dumps(sealed))) == started
    with resolving({}), pytest.raises(CodecError):
        open_event(chain, json.loads(json.dumps(sealed)))


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        (CodecFailure.BLOB_MISSING, PoisonReason.BLOB_MISSING),
        (CodecFailure.BLOB_TAMPERED, PoisonReason.BLOB_TAMPERED),
        (CodecFailure.UNKNOWN_KEY, PoisonReason.UNDECODABLE),
    ],
)
def test_blob_failures_dead_letter_with_their_own_reason(
    failure: CodecFailure, reason: PoisonReason
) -> None:
    assert dead_letter_reason(CodecError(failure, "x")) is reason


def test_the_ref_codec_must_come_last() -> None:
    with pytest.raises(CodecError, match="last"):
        CodecChain(ReferenceCodec(10, MAC, "t"), ZstdCodec())


def test_settings_build_the_chain_with_the_ref_codec_last() -> None:
    mac = base64.b64encode(MAC).decode()
    settings = CodecSettings(
        compression="zstd",
        blobs=BlobSettings(threshold_bytes=4096, mac_key=SecretStr(mac)),
    )
    chain = CodecChain.from_settings(settings)
    assert chain is not None
    assert chain.name == "zstd,ref"
    assert chain.reference is not None
    assert chain.reference.threshold == 4096
    assert CodecChain.from_settings(CodecSettings()) is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"threshold_bytes": 10}, "mac_key"),
        ({"threshold_bytes": 10, "mac_key": SecretStr("!!")}, "base64"),
        ({"threshold_bytes": 10, "mac_key": SecretStr(base64.b64encode(b"short").decode())}, "16"),
        (
            {
                "threshold_bytes": 10,
                "mac_key": SecretStr(base64.b64encode(MAC).decode()),
                "store": "directory",
            },
            "directory",
        ),
    ],
)
def test_bad_blob_settings_are_refused_with_what_to_set(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        BlobSettings.model_validate(fields)


def test_the_payload_limit_is_the_message_size_unless_payloads_go_by_reference() -> None:
    plain = Settings()
    assert payload_limit(plain) == plain.kafka.max_message_bytes
    on = Settings(
        codec=CodecSettings(
            blobs=BlobSettings(
                threshold_bytes=1024, mac_key=SecretStr(base64.b64encode(MAC).decode())
            )
        )
    )
    assert payload_limit(on) == on.codec.blobs.max_bytes
    # Off, the error says how to turn it on.
    assert "SAGA_CODEC__BLOBS__THRESHOLD_BYTES" in str(PayloadTooLarge(2_000_000, 1_000_000))

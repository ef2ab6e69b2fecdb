"""Kafka records by reference (``transport/_record_blobs``): a command or reply encoded
collecting its blob, found and verified without a key, resolved; a forged reference, a
missing or an altered blob give their dead-letter reasons; a command measured as it is
sent; the reference's MAC key ids, rotated."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Collection, Mapping

import pytest
from pydantic import SecretStr, ValidationError

from saga_engine.core.history._blobref import ReferenceCodec, collecting, resolving
from saga_engine.core.history._codec import CodecChain, GzipCodec
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.kernel._errors import CodecError, CodecFailure, PoisonMessage
from saga_engine.kernel._poison import PoisonReason
from saga_engine.settings import BlobSettings, CodecSettings
from saga_engine.transport._command_records import CommandRecords
from saga_engine.transport._record_blobs import fetch_record_blobs, record_reference
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import Envelope, MessageType, decode, encode

OLD = b"o" * 32
NEW = b"n" * 32
BIG: dict[str, object] = {
    "pdf": "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(100))
}


def chain(keys: dict[str, bytes] | None = None, current: str = "new") -> CodecChain:
    keys = keys if keys is not None else {"old": OLD, "new": NEW}
    return CodecChain(ReferenceCodec(1024, keys, "postgres", current=current))


def reply(body: Mapping[str, object]) -> Envelope:
    return Envelope(
        message_type=MessageType.REPLY,
        source="/participants/archive",
        saga_id="saga-1",
        command_id="c-1",
        body={"outcome": "success", "payload": dict(body)},
    )


def encoded(
    codec: CodecChain, body: Mapping[str, object]
) -> tuple[bytes, bytes, list[tuple[str, bytes]], dict[str, bytes]]:
    blobs: dict[str, bytes] = {}
    key, value, headers = encode(reply(body), codec, blobs=blobs)
    return key, value, headers, blobs


class Blobs:
    def __init__(self, held: dict[str, bytes]) -> None:
        self.held = held
        self.asked: list[list[str]] = []

    async def keep(self, saga_id: str, blobs: Mapping[str, bytes]) -> None:
        self.held.update(blobs)

    async def fetch(self, digests: Collection[str]) -> dict[str, bytes]:
        self.asked.append(list(digests))
        return {d: self.held[d] for d in digests if d in self.held}


async def test_a_large_record_goes_by_reference_and_resolves() -> None:
    codec = chain()
    key, value, headers, blobs = encoded(codec, BIG)
    assert len(blobs) == 1
    assert len(value) < 512
    ref = record_reference(value, headers, codec)
    assert ref is not None
    assert ref.kid == "new"
    assert ref.sha256 in blobs
    store = Blobs(dict(blobs))
    fetched = await fetch_record_blobs(value, headers, codec, store)
    with resolving(fetched):
        envelope = decode(key, value, headers, max_bytes=1_000_000, codec=codec)
    assert envelope.body["payload"] == BIG


async def test_a_small_record_stays_inline_and_nothing_is_fetched() -> None:
    codec = chain()
    key, value, headers, blobs = encoded(codec, {"small": True})
    assert blobs == {}
    # The ref codec alone leaves a small record clear: any reader takes it.
    assert "saga-codec" not in dict(headers)
    assert value == b'{"outcome":"success","payload":{"small":true}}'
    store = Blobs({})
    assert await fetch_record_blobs(value, headers, codec, store) == {}
    assert store.asked == []
    assert decode(key, value, headers, max_bytes=1_000_000, codec=codec).body["payload"] == {
        "small": True
    }


def test_without_blobs_to_collect_into_a_record_stays_inline() -> None:
    codec = chain()
    _, value, headers = encode(reply(BIG), codec)
    assert record_reference(value, headers, codec) is None
    assert "saga-codec" not in dict(headers)
    assert len(value) > 4096


def test_a_chain_with_other_codecs_seals_every_record() -> None:
    codec = CodecChain(GzipCodec(), ReferenceCodec(1024, NEW, "postgres"))
    _, value, headers, blobs = encoded(codec, {"small": True})
    assert dict(headers)["saga-codec"] == b"gzip,ref"
    assert blobs == {}
    assert record_reference(value, headers, codec) is None


async def test_a_missing_blob_is_blob_missing() -> None:
    codec = chain()
    key, value, headers, _ = encoded(codec, BIG)
    fetched = await fetch_record_blobs(value, headers, codec, Blobs({}))
    with resolving(fetched), pytest.raises(PoisonMessage) as caught:
        decode(key, value, headers, max_bytes=1_000_000, codec=codec)
    assert caught.value.reason is PoisonReason.BLOB_MISSING


async def test_an_altered_blob_is_blob_tampered() -> None:
    codec = chain()
    key, value, headers, blobs = encoded(codec, BIG)
    ((digest, blob),) = blobs.items()
    fetched = await fetch_record_blobs(value, headers, codec, Blobs({digest: blob[:-1] + b"!"}))
    with resolving(fetched), pytest.raises(PoisonMessage) as caught:
        decode(key, value, headers, max_bytes=1_000_000, codec=codec)
    assert caught.value.reason is PoisonReason.BLOB_TAMPERED


async def test_a_forged_reference_is_refused_before_anything_is_fetched() -> None:
    forger = chain({"new": b"f" * 32})
    _, value, headers, _ = encoded(forger, BIG)
    store = Blobs({})
    with pytest.raises(CodecError) as caught:
        await fetch_record_blobs(value, headers, chain(), store)
    assert caught.value.failure is CodecFailure.BLOB_TAMPERED
    assert store.asked == []


def test_a_reference_under_a_rotated_key_still_verifies() -> None:
    before = chain({"old": OLD}, current="old")
    with collecting() as blobs:
        data = before.encode(b"x" * 2048)
    after = chain()  # "new" current, "old" kept
    with resolving(blobs):
        assert after.decode(data) == b"x" * 2048
    with collecting() as fresh:
        again = after.encode(b"y" * 2048)
    ref = ReferenceCodec.reference(again)
    assert ref is not None
    assert ref.kid == "new"
    dropped = chain({"new": NEW})  # the old key dropped: its references no longer verify
    with resolving(blobs), pytest.raises(CodecError, match="'old'") as caught:
        dropped.decode(data)
    assert caught.value.failure is CodecFailure.BLOB_TAMPERED
    assert fresh


def test_a_reference_made_under_the_unnamed_key_verifies_beside_named_ones() -> None:
    legacy = CodecChain(ReferenceCodec(1024, OLD, "postgres"))
    with collecting() as blobs:
        data = legacy.encode(b"z" * 2048)
    ref = ReferenceCodec.reference(data)
    assert ref is not None
    assert ref.kid == ""
    both = chain({"": OLD, "new": NEW})
    with resolving(blobs):
        assert both.decode(data) == b"z" * 2048


def b64(key: bytes) -> SecretStr:
    return SecretStr(base64.b64encode(key).decode())


def test_settings_name_the_current_mac_key_and_keep_the_single_key_working() -> None:
    rotated = BlobSettings(
        threshold_bytes=10, mac_keys={"a": b64(OLD), "b": b64(NEW)}, current_mac_key="b"
    )
    built = CodecChain.from_settings(CodecSettings(blobs=rotated))
    assert built is not None
    assert built.reference is not None
    assert built.reference.current == "b"
    single = BlobSettings(threshold_bytes=10, mac_key=b64(OLD))
    assert single.current_mac_key_id == ""
    with pytest.raises(ValidationError, match="current_key"):
        BlobSettings(threshold_bytes=10, mac_keys={"a": b64(OLD), "b": b64(NEW)})
    with pytest.raises(ValidationError, match="mac_keys"):
        BlobSettings(threshold_bytes=10)
    with pytest.raises(ValidationError, match=r"mac_keys\['a'\] is 5 bytes"):
        BlobSettings(threshold_bytes=10, mac_keys={"a": b64(b"short")})


def test_a_command_is_measured_as_it_is_sent_by_reference() -> None:
    codec = chain()
    command = OutboundCommand(
        saga_id="saga-1",
        saga_type="archive-document",
        command_id="c-1",
        step="archive",
        participant="archive",
        command_type="Archive",
        payload=BIG,
        attempt=1,
        compensation=False,
    )
    by_reference = CommandRecords(Topics("saga"), "/saga-engine", codec, by_reference=True)
    inline = CommandRecords(Topics("saga"), "/saga-engine", codec)
    assert by_reference.size(command) < 1024 < inline.size(command)
    blobs: dict[str, bytes] = {}
    _, _, value, headers = by_reference.record(command, blobs=blobs)
    assert len(blobs) == 1
    ref = record_reference(value, headers, codec)
    assert ref is not None
    assert ref.sha256 in blobs

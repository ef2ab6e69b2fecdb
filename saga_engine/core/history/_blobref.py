"""Payloads stored by reference: the ``ref`` codec, last in a codec chain.

A payload whose encoded bytes (compressed, encrypted: the chain's output so far) are
``threshold`` bytes or more is handed to the writer that *collects* blobs, and the
codec's output is a reference in its place::

    b"\\x01" + {"sha256": "<hex of the blob>", "size": 10485760, "store": "postgres",
                "mac": "<hex of HMAC-SHA256(mac key, sha256:size:store)>"}

A smaller payload, or one encoded where nothing collects blobs (a Kafka record, today),
follows a ``0`` byte as it was. The writer stores the collected blobs with the events
that reference them (``store/_pgblobs.py``: in the same transaction on Postgres). A
reader fetches the blobs a saga references, and decodes under :func:`resolving`; the
codec verifies the reference's MAC (a forged reference cannot point at another blob),
then the blob's size and content hash. A blob that is not there, or does not verify,
raises CodecError ``blob_missing`` or ``blob_tampered``: the record is dead-lettered
with that reason (``kernel/_dead_letter_reason.py``) and the saga is not driven.

Pure: no I/O. Collecting and resolving are context variables, so the codec keeps the
``PayloadCodec`` shape (``encode(bytes) -> bytes``) and the chain is unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final

from saga_engine.kernel._errors import CodecError, CodecFailure, SerializationError
from saga_engine.kernel._serde import dumps, loads

__all__ = ["BlobRef", "ReferenceCodec", "collecting", "resolving"]

_INLINE: Final = 0
_REFERENCE: Final = 1

#: The blobs the payloads encoded in this context referenced, by content hash (None:
#: nothing collects here, payloads stay inline).
_COLLECTED: ContextVar[dict[str, bytes] | None] = ContextVar("saga_blobs_collected", default=None)
#: The blobs a reader fetched for the payloads it decodes in this context.
_RESOLVED: ContextVar[Mapping[str, bytes] | None] = ContextVar("saga_blobs_resolved", default=None)


@contextlib.contextmanager
def collecting() -> Iterator[dict[str, bytes]]:
    """Payloads encoded inside go by reference when large; the yielded dict receives
    their blobs (content hash -> bytes), for the caller to store with the events."""
    blobs: dict[str, bytes] = {}
    token = _COLLECTED.set(blobs)
    try:
        yield blobs
    finally:
        _COLLECTED.reset(token)


@contextlib.contextmanager
def resolving(blobs: Mapping[str, bytes]) -> Iterator[None]:
    """References decoded inside are resolved from ``blobs`` (content hash -> bytes)."""
    token = _RESOLVED.set(blobs)
    try:
        yield
    finally:
        _RESOLVED.reset(token)


@dataclass(frozen=True, slots=True)
class BlobRef:
    """What a reference names: the blob's content hash (SHA-256, hex), its size, the
    store it was written to, and the MAC over the three."""

    sha256: str
    size: int
    store: str
    mac: str


def digest_of(data: bytes) -> str:
    """A blob's content hash, as references and stores name it."""
    return hashlib.sha256(data).hexdigest()


class ReferenceCodec:
    """Stores payloads of ``threshold`` bytes or more by reference (module docstring).

    ``mac_key``: at least 16 bytes, the same in every process of a deployment;
    ``store``: the name written into references (``postgres``, ``directory``, or a
    store of the user's); ``max_bytes``: the largest blob a reference may name.
    """

    name = "ref"

    def __init__(
        self, threshold: int, mac_key: bytes, store: str, max_bytes: int = 64 * 1024 * 1024
    ) -> None:
        if threshold < 1:
            raise CodecError(CodecFailure.BAD_CONFIG, f"ref: threshold {threshold} is below 1")
        if len(mac_key) < 16:
            raise CodecError(
                CodecFailure.BAD_CONFIG, f"ref: the MAC key is {len(mac_key)} bytes; 16 or more"
            )
        if not store:
            raise CodecError(CodecFailure.BAD_CONFIG, "ref: the store needs a name")
        self.threshold = threshold
        self.store = store
        self.max_bytes = max_bytes
        self._key = mac_key

    def _mac(self, sha256: str, size: int, store: str) -> str:
        message = f"{sha256}:{size}:{store}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def encode(self, data: bytes) -> bytes:
        collected = _COLLECTED.get()
        if collected is None or len(data) < self.threshold:
            return b"\x00" + data
        sha256 = digest_of(data)
        collected[sha256] = data
        ref = {
            "sha256": sha256,
            "size": len(data),
            "store": self.store,
            "mac": self._mac(sha256, len(data), self.store),
        }
        return b"\x01" + dumps(ref)

    def decode(self, data: bytes) -> bytes:
        flag = data[0] if data else -1
        if flag == _INLINE:
            return data[1:]
        ref = self.reference(data)
        if ref is None:
            raise CodecError(CodecFailure.MALFORMED, f"ref: unknown flag byte {flag}")
        expected = self._mac(ref.sha256, ref.size, ref.store)
        if not hmac.compare_digest(expected, ref.mac):
            raise CodecError(
                CodecFailure.BLOB_TAMPERED,
                f"the reference to blob sha256:{ref.sha256} does not verify under this MAC "
                "key: the reference was altered, or SAGA_CODEC__BLOBS__MAC_KEY differs here",
            )
        blob = (_RESOLVED.get() or {}).get(ref.sha256)
        if blob is None:
            raise CodecError(
                CodecFailure.BLOB_MISSING,
                f"blob sha256:{ref.sha256} ({ref.size:,} bytes, store {ref.store!r}) is not "
                "in the blob store: restore it, then replay the record",
            )
        if len(blob) != ref.size or digest_of(blob) != ref.sha256:
            raise CodecError(
                CodecFailure.BLOB_TAMPERED,
                f"blob sha256:{ref.sha256} in store {ref.store!r} does not hash to its name "
                f"({len(blob):,} bytes, {ref.size:,} expected): it was altered",
            )
        return blob

    @staticmethod
    def reference(data: bytes) -> BlobRef | None:
        """The reference ``data`` (this codec's output) holds; None for an inline
        payload. Read without any key: a reader learns which blob to fetch."""
        if not data or data[0] != _REFERENCE:
            return None
        try:
            raw = loads(data[1:])
            ref = BlobRef(raw["sha256"], raw["size"], raw["store"], raw["mac"])
        except (SerializationError, KeyError, TypeError):
            raise CodecError(CodecFailure.MALFORMED, "ref: the reference is unreadable") from None
        fields_ok = (
            isinstance(ref.sha256, str)
            and len(ref.sha256) == 64
            and type(ref.size) is int
            and ref.size >= 0
            and isinstance(ref.store, str)
            and isinstance(ref.mac, str)
        )
        if not fields_ok:
            raise CodecError(CodecFailure.MALFORMED, "ref: the reference is unreadable")
        return ref

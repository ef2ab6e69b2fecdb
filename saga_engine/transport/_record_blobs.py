"""Kafka records by reference (docs/large-payloads.md, PROTOCOL.md 15.4): a command or
a reply whose sealed body is ``threshold_bytes`` or more travels as a reference to a
blob, and its reader resolves it.

The writer encodes the record collecting its blobs (``encode_fields(..., blobs=...)``),
then hands them to :class:`RecordBlobs` ``keep`` **before** the record is sent: the
blob is written with a reference from the record's saga (``saga_blob_refs``; on
Postgres, blob and reference in one transaction), so a record on the broker never
names a blob that is not there, and the sweeper never deletes it while the saga is
kept (retention drops the reference with the saga). A record in flight, waiting in a
partition, dead-lettered and replayed weeks later: its blob is there as long as its
saga is.

The reader finds the record's reference (:func:`record_reference`: read without a key,
its MAC and size verified before anything is fetched, so a forged reference never
makes a reader fetch or trust anything), fetches the blob (``fetch``), and decodes the
record under ``resolving``. A blob that is missing or does not verify raises CodecError
``blob_missing`` or ``blob_tampered``: the record is dead-lettered with that reason
(``kernel/_dead_letter_reason``), never taken as a failure.

The port is implemented on Postgres by ``store/_pgblobs.PostgresRecordBlobs`` (for
either blob store: the references are rows of the engine's database).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection, Mapping
from typing import Final, Protocol

from saga_engine.core.history._blobref import BlobRef, ReferenceCodec
from saga_engine.core.history._codec import HEADER, MARKER, CodecChain
from saga_engine.kernel._errors import CodecError, SerializationError
from saga_engine.kernel._serde import loads

__all__ = ["RecordBlobs", "fetch_record_blobs", "record_reference"]

#: A reference record's value is a marker holding a reference: far below this. A longer
#: value is read as inline without parsing it twice.
_REFERENCE_VALUE_MAX: Final = 2048


class RecordBlobs(Protocol):
    """Where the blobs of records by reference are kept and read (module docstring)."""

    async def keep(self, saga_id: str, blobs: Mapping[str, bytes]) -> None:
        """Writes ``blobs`` (content hash -> bytes) and a reference to each from the
        saga ``saga_id``, durably, before returning: the record may be sent then."""
        ...

    async def fetch(self, digests: Collection[str]) -> dict[str, bytes]:
        """The blobs of ``digests`` the store holds (a missing one is left out)."""
        ...


def record_reference(
    value: bytes | None, headers: list[tuple[str, bytes]], codec: CodecChain | None
) -> BlobRef | None:
    """The reference a record's value holds, its MAC and size verified (CodecError
    ``blob_tampered`` otherwise); None for a value that is not a reference (inline, or
    unreadable: decoding it says why)."""
    if codec is None or codec.reference is None or not value or len(value) > _REFERENCE_VALUE_MAX:
        return None
    chain = next((raw for name, raw in reversed(headers) if name == HEADER), b"")
    if chain.rsplit(b",", 1)[-1] != ReferenceCodec.name.encode():
        return None
    try:
        marker = loads(value)
        data = base64.b64decode(marker["data"], validate=True)
        ref = ReferenceCodec.reference(data) if marker.get(MARKER) else None
    except (SerializationError, CodecError, binascii.Error, LookupError, TypeError, ValueError):
        return None  # decoding says what is wrong with it
    except AttributeError:  # JSON, but not an object
        return None
    if ref is not None:
        codec.reference.verify(ref)
    return ref


async def fetch_record_blobs(
    value: bytes | None,
    headers: list[tuple[str, bytes]],
    codec: CodecChain | None,
    blobs: RecordBlobs | None,
) -> dict[str, bytes]:
    """The blob a record's reference names, fetched (empty for an inline record, or
    where no blob store is configured: decoding a reference then says it is missing)."""
    ref = record_reference(value, headers, codec)
    if ref is None or blobs is None:
        return {}
    return await blobs.fetch([ref.sha256])

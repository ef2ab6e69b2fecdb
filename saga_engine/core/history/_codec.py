"""Payload codecs: what turns a payload's bytes into stored or sent bytes and back.

A :class:`PayloadCodec` is ``encode(bytes) -> bytes`` and ``decode(bytes) -> bytes`` with
a ``name``. A :class:`CodecChain` runs several in order on the way out (compression
first, then encryption: ciphertext does not compress) and in reverse on the way in,
and wraps the result in a *marker* that says how it was made, so a reader knows::

    {"$codec": "zstd,aes-gcm", "data": "<base64 of the chain's output>"}

The same marker is a Kafka record's value (with a ``saga-codec`` header naming the
chain) and a payload field of a stored event (``saga_events.data``; the event itself
lists the fields it sealed under ``"$codec"``). proto/PROTOCOL.md documents the layout
byte by byte, for participants in other languages.

Why per field and not the whole event: the event's shape (its kind, step, command id,
outcome) stays readable, so an operator without the key still sees the saga's story,
with each sealed payload shown as encrypted, and the listing, timers and folds work.

Pure: no I/O. ``cryptography`` and ``zstandard`` are imported when such a codec is
built, so ``import saga_engine`` stays light.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import re
import threading
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from saga_engine.core.history._blobref import ReferenceCodec
from saga_engine.core.history._events import Event, event_from_dict
from saga_engine.core.history._structs import InvalidRecord
from saga_engine.kernel._errors import CodecError, CodecFailure, SerializationError
from saga_engine.kernel._serde import JsonDict, dumps, loads

if TYPE_CHECKING:
    from saga_engine.kernel._settings import CodecSettings

#: The key of a marker (and, in a stored event, of the list of the fields it sealed).
MARKER: Final = "$codec"
#: The Kafka header naming the chain that encoded a record's value.
HEADER: Final = "saga-codec"
#: What an operator sees in place of a payload this process cannot decode.
ENCRYPTED: Final = "$encrypted"

#: Where each stored event kind carries payloads (user data). Dotted: a nested field.
#: Everything else (ids, step names, outcomes, times, error texts) stays clear: the
#: engine's queries and an operator's reading need them.
PAYLOAD_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "saga_started": ("input",),
    "reply_received": ("payload",),
    "signal_received": ("payload",),
    "domain_event_received": ("payload",),
    "callback_received": ("payload",),
    "step_skipped": ("payload",),
    "command_issued": ("payload", "compensation.payload"),
    "compensation_issued": ("payload",),
    "side_effect_recorded": ("value",),
    "progress_emitted": ("payload",),
    "saga_completed": ("output",),
    # An error's details can hold a payload: a refused step's reply payload becomes the
    # StepFailed's details, and so the saga's error.
    "compensation_started": ("error.details",),
    "compensation_stuck": ("error.details",),
    "saga_failed": ("error.details",),
    "saga_compensated": ("error.details",),
    "invalid_reply_received": ("payload", "error.details"),
}

_KEY_ID: Final = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
#: A decompressed payload is never larger than this: a small frame claiming more is
#: refused instead of allocated (the engine's own payload limits are far below it).
MAX_DECODED_BYTES: Final = 64 * 1024 * 1024


@runtime_checkable
class PayloadCodec(Protocol):
    """Turns a payload's bytes into other bytes and back. ``decode(encode(b)) == b``.

    ``name`` goes into every marker the codec's output is wrapped in, so it must be
    stable and must not contain a comma; a chain finds the codec to decode with by it.
    """

    @property
    def name(self) -> str: ...

    def encode(self, data: bytes) -> bytes: ...

    def decode(self, data: bytes) -> bytes: ...


class NoopCodec:
    """Encodes nothing: the ceiling of the codec machinery's own cost (bench/codec.py)."""

    name = "noop"

    def encode(self, data: bytes) -> bytes:
        return data

    def decode(self, data: bytes) -> bytes:
        return data


# --------------------------------------------------------------------------- compression

_RAW: Final = 0
_PACKED: Final = 1


class _Compressor:
    """Compression above a size threshold. The first byte says what was done: 0 the
    payload follows as it was (small, or it did not shrink), 1 it follows compressed."""

    name = ""

    def __init__(self, threshold: int) -> None:
        if threshold < 0:
            raise CodecError(CodecFailure.BAD_CONFIG, f"threshold {threshold} is negative")
        self.threshold = threshold

    def _pack(self, data: bytes) -> bytes:
        raise NotImplementedError

    def _unpack(self, data: bytes) -> bytes:
        raise NotImplementedError

    def encode(self, data: bytes) -> bytes:
        if len(data) >= self.threshold:
            packed = self._pack(data)
            if len(packed) < len(data):
                return b"\x01" + packed
        return b"\x00" + data

    def decode(self, data: bytes) -> bytes:
        flag = data[0] if data else -1
        if flag == _RAW:
            return data[1:]
        if flag != _PACKED:
            raise CodecError(CodecFailure.MALFORMED, f"{self.name}: unknown flag byte {flag}")
        try:
            out = self._unpack(data[1:])
        except CodecError:
            raise
        except Exception as exc:  # each library has its own error types
            raise CodecError(CodecFailure.MALFORMED, f"{self.name}: {exc}") from None
        return out


class ZstdCodec(_Compressor):
    """zstd (the ``zstandard`` package) for payloads of ``threshold`` bytes or more."""

    name = "zstd"

    def __init__(self, threshold: int = 1024, level: int = 3) -> None:
        super().__init__(threshold)
        import zstandard

        self._zstd = zstandard
        self.level = level
        # zstandard's (de)compressors must not be used by two threads at once, and
        # retention seals its archive files in a worker thread: one pair per thread.
        self._local = threading.local()

    def _contexts(self) -> tuple[Any, Any]:
        pair: tuple[Any, Any] | None = getattr(self._local, "pair", None)
        if pair is None:
            pair = (
                self._zstd.ZstdCompressor(level=self.level),
                self._zstd.ZstdDecompressor(),
            )
            self._local.pair = pair
        return pair

    def _pack(self, data: bytes) -> bytes:
        packed: bytes = self._contexts()[0].compress(data)
        return packed

    def _unpack(self, data: bytes) -> bytes:
        size = self._zstd.frame_content_size(data)
        if size < 0 or size > MAX_DECODED_BYTES:
            raise CodecError(CodecFailure.MALFORMED, f"zstd: frame of {size} bytes refused")
        out: bytes = self._contexts()[1].decompress(data)
        return out


class GzipCodec(_Compressor):
    """gzip (the standard library's) for payloads of ``threshold`` bytes or more."""

    name = "gzip"

    def __init__(self, threshold: int = 1024, level: int = 6) -> None:
        super().__init__(threshold)
        import gzip
        import zlib

        self.level = level
        self._gzip = gzip
        self._zlib = zlib

    def _pack(self, data: bytes) -> bytes:
        # mtime=0: the same payload encodes to the same bytes.
        return self._gzip.compress(data, compresslevel=self.level, mtime=0)

    def _unpack(self, data: bytes) -> bytes:
        inflater = self._zlib.decompressobj(wbits=31)  # 31: a gzip header and trailer
        out = inflater.decompress(data, MAX_DECODED_BYTES)
        if inflater.unconsumed_tail:
            raise CodecError(CodecFailure.MALFORMED, "gzip: more than the size limit")
        return out


# --------------------------------------------------------------------------- encryption

_AES_VERSION: Final = 1
_NONCE: Final = 12
_TAG: Final = 16


class AesGcmCodec:
    """AES-GCM (the ``cryptography`` package) with key ids, so keys rotate.

    ``keys`` maps key ids to 16, 24 or 32-byte keys; ``current`` names the one new
    payloads are encrypted with. Every key given decodes, so a rotation adds a key and
    makes it current, and keeps the old ones for as long as histories encrypted with them
    are kept. Layout (PROTOCOL.md): version byte 1, key id length, key id (ASCII), a
    random 96-bit nonce, the ciphertext and its 16-byte tag; the first three are the
    associated data, so a key id cannot be swapped under a ciphertext.

    A random nonce per payload: keep one key for well under 2**32 payloads (NIST's bound
    for random nonces), that is rotate it yearly at a hundred payloads a second.
    """

    name = "aes-gcm"

    def __init__(self, keys: Mapping[str, bytes], current: str) -> None:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._invalid_tag = InvalidTag

        if current not in keys:
            raise CodecError(
                CodecFailure.BAD_CONFIG, f"the current key id {current!r} is not among the keys"
            )
        self._aead: dict[str, Any] = {}
        self._prefixes: dict[str, bytes] = {}
        for key_id, key in keys.items():
            if not _KEY_ID.match(key_id):
                raise CodecError(
                    CodecFailure.BAD_CONFIG,
                    f"key id {key_id!r}: 1 to 64 characters of A-Z a-z 0-9 . _ -",
                )
            if len(key) not in (16, 24, 32):
                raise CodecError(
                    CodecFailure.BAD_CONFIG,
                    f"key {key_id!r} is {len(key)} bytes; AES-GCM takes 16, 24 or 32",
                    key_id=key_id,
                )
            self._aead[key_id] = AESGCM(key)
            self._prefixes[key_id] = bytes([_AES_VERSION, len(key_id)]) + key_id.encode()
        self.current = current
        self.key_ids = frozenset(keys)
        self._encrypt = self._aead[current].encrypt
        self._prefix = self._prefixes[current]

    def encode(self, data: bytes) -> bytes:
        nonce = os.urandom(_NONCE)
        sealed: bytes = self._encrypt(nonce, data, self._prefix)
        return self._prefix + nonce + sealed

    def decode(self, data: bytes) -> bytes:
        key_id = self.key_id_of(data)
        aead = self._aead.get(key_id)
        if aead is None:
            raise CodecError(
                CodecFailure.UNKNOWN_KEY,
                f"encrypted with key {key_id!r}, which this process does not hold "
                f"(it holds {', '.join(sorted(self.key_ids))})",
                key_id=key_id,
            )
        start = 2 + len(key_id)
        nonce, sealed = data[start : start + _NONCE], data[start + _NONCE :]
        if len(sealed) < _TAG:
            raise CodecError(CodecFailure.MALFORMED, "aes-gcm: truncated", key_id=key_id)
        try:
            out: bytes = aead.decrypt(nonce, sealed, data[:start])
        except self._invalid_tag:
            raise CodecError(
                CodecFailure.TAMPERED,
                f"the authentication tag does not verify under key {key_id!r}: the payload "
                "was altered, or that key id names a different key here",
                key_id=key_id,
            ) from None
        return out

    @staticmethod
    def key_id_of(data: bytes) -> str:
        """The key id an encoded payload names, read without any key."""
        if len(data) < 2 or data[0] != _AES_VERSION:
            raise CodecError(CodecFailure.MALFORMED, "aes-gcm: not a version 1 payload")
        end = 2 + data[1]
        try:
            key_id = data[2:end].decode("ascii")
        except UnicodeDecodeError:
            key_id = ""
        if len(key_id) != data[1] or not _KEY_ID.match(key_id):
            raise CodecError(CodecFailure.MALFORMED, "aes-gcm: the key id is unreadable")
        return key_id


# --------------------------------------------------------------------------- chain


class CodecChain:
    """Codecs in the order they encode (compression before encryption), and the markers
    their output travels in. Decoding follows the marker's names, not the chain's order:
    a payload written before compression was turned on still decodes."""

    def __init__(self, *codecs: PayloadCodec) -> None:
        if not codecs:
            raise CodecError(CodecFailure.BAD_CONFIG, "a codec chain needs at least one codec")
        names = [c.name for c in codecs]
        if len(set(names)) != len(names) or any(not n or "," in n for n in names):
            raise CodecError(
                CodecFailure.BAD_CONFIG, f"codec names must be unique, without commas: {names}"
            )
        self.codecs = codecs
        self.name = ",".join(names)
        #: The ``saga-codec`` header's value.
        self.header = self.name.encode()
        self._by_name = dict(zip(names, codecs, strict=True))
        last = codecs[-1]
        if any(isinstance(c, ReferenceCodec) for c in codecs[:-1]):
            raise CodecError(
                CodecFailure.BAD_CONFIG, f"the ref codec must come last in a chain: {names}"
            )
        #: The codec storing payloads by reference (docs/large-payloads.md), when it is
        #: the chain's last: writers collect blobs and readers resolve them only then.
        self.reference = last if isinstance(last, ReferenceCodec) else None

    @classmethod
    def from_settings(cls, settings: CodecSettings) -> CodecChain | None:
        """The chain ``SAGA_CODEC__*`` (``Settings().codec``) describes; None when it
        configures none."""
        codecs: list[PayloadCodec] = []
        if settings.compression == "zstd":
            codecs.append(ZstdCodec(settings.compress_threshold))
        elif settings.compression == "gzip":
            codecs.append(GzipCodec(settings.compress_threshold))
        if settings.keys:
            keys = {
                key_id: decode_key(key_id, k.get_secret_value())
                for key_id, k in settings.keys.items()
            }
            current = settings.current_key or (next(iter(keys)) if len(keys) == 1 else "")
            codecs.append(AesGcmCodec(keys, current))
        blobs = settings.blobs
        if blobs.threshold_bytes is not None:
            # Last: the blob is what compression and encryption made of the payload.
            mac_keys = {
                key_id: decode_key(f"blobs.mac_keys[{key_id!r}]" if key_id else "blobs.mac_key", k)
                for key_id, k in blobs.mac_key_texts().items()
            }
            codecs.append(
                ReferenceCodec(
                    blobs.threshold_bytes,
                    mac_keys,
                    blobs.store,
                    blobs.max_bytes,
                    current=blobs.current_mac_key_id,
                )
            )
        return cls(*codecs) if codecs else None

    @classmethod
    def of(cls, codec: PayloadCodec | CodecChain | None) -> CodecChain | None:
        """``codec`` as a chain (None stays None: no codec, the hot path unchanged)."""
        if codec is None or isinstance(codec, CodecChain):
            return codec
        return cls(codec)

    # ------------------------------------------------------------------ bytes

    def encode(self, data: bytes) -> bytes:
        for codec in self.codecs:
            data = codec.encode(data)
        return data

    def decode(self, data: bytes, name: str | None = None) -> bytes:
        """Decodes what the chain ``name`` (a marker's) encoded; this chain by default."""
        if name is None or name == self.name:
            for codec in reversed(self.codecs):
                data = codec.decode(data)
            return data
        for part in reversed(name.split(",")):
            found = self._by_name.get(part)
            if found is None:
                raise CodecError(
                    CodecFailure.UNKNOWN_CODEC,
                    f"encoded with {name!r}; this process has {self.name!r}",
                )
            data = found.decode(data)
        return data

    # ------------------------------------------------------------------ markers

    def seal(self, value: Any) -> JsonDict:
        """A JSON value as its marker."""
        return {MARKER: self.name, "data": base64.b64encode(self.encode(dumps(value))).decode()}

    def seal_json(self, raw: bytes) -> bytes:
        """JSON text as its marker's JSON text (a Kafka value, an outbox row)."""
        return dumps({MARKER: self.name, "data": base64.b64encode(self.encode(raw)).decode()})

    def open_raw(self, marker: Any) -> bytes:
        """The JSON text a marker holds."""
        name, data = _marker_parts(marker)
        return self.decode(data, name)

    def open(self, marker: Any) -> Any:
        """The JSON value a marker holds."""
        try:
            return loads(self.open_raw(marker))
        except SerializationError as exc:
            raise CodecError(
                CodecFailure.MALFORMED, f"decoded to something not JSON: {exc}"
            ) from None


def is_marker(value: Any) -> bool:
    return type(value) is dict and MARKER in value and "data" in value


def _marker_parts(marker: Any) -> tuple[str, bytes]:
    if not is_marker(marker) or not isinstance(marker[MARKER], str):
        raise CodecError(CodecFailure.MALFORMED, 'not a {"$codec", "data"} marker')
    try:
        return marker[MARKER], base64.b64decode(marker["data"], validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise CodecError(CodecFailure.MALFORMED, "the marker's data is not base64") from None


def describe(marker: Any, failure: CodecFailure) -> JsonDict:
    """What an operator sees for a payload this process cannot decode: the codec and,
    when encrypted, the key id (read without the key)."""
    shown: JsonDict = {"failure": failure.value}
    try:
        name, data = _marker_parts(marker)
    except CodecError:
        return {ENCRYPTED: shown}
    shown["codec"] = name
    if name.split(",")[-1] == AesGcmCodec.name:
        with contextlib.suppress(CodecError):
            shown["key_id"] = AesGcmCodec.key_id_of(data)
    return {ENCRYPTED: shown}


# --------------------------------------------------------------------------- events


class Undecodable(StrEnum):
    """What a store read does with a payload it cannot decode."""

    #: Raise CodecError: the engine must never drive a saga on what it cannot read.
    RAISE = "raise"
    #: Show it as ``{"$encrypted": {...}}``: an operator reading without the key.
    SHOW = "show"


def _slot(data: JsonDict, path: str) -> tuple[JsonDict | None, str]:
    head, _, rest = path.partition(".")
    if not rest:
        return data, head
    inner = data.get(head)
    return (inner, rest) if type(inner) is dict else (None, rest)


def seal_event(chain: CodecChain, data: JsonDict) -> JsonDict:
    """A stored event's dict with its payload fields sealed, and the sealed fields listed
    under ``"$codec"`` (changes ``data``, a fresh ``model_dump``, in place)."""
    sealed = []
    for path in PAYLOAD_FIELDS.get(data["kind"], ()):
        holder, key = _slot(data, path)
        if holder is not None and key in holder:
            holder[key] = chain.seal(holder[key])
            sealed.append(path)
    if sealed:
        data[MARKER] = sealed
    return data


def open_event(
    chain: CodecChain | None, data: JsonDict, undecodable: Undecodable = Undecodable.RAISE
) -> Event:
    """A stored event from its row's dict, sealed fields decoded.

    Without a codec the dict is read as it is; a sealed event then fails validation
    (events forbid unknown keys, and ``"$codec"`` is one), and only then is it looked at:
    an engine without a codec pays nothing per event for the feature.
    """
    if chain is None and undecodable is Undecodable.RAISE:
        try:
            return event_from_dict(data)
        except InvalidRecord:
            if MARKER in data:
                raise CodecError(
                    CodecFailure.NOT_CONFIGURED,
                    f"a stored {data.get('kind')} event is encoded ({data[MARKER]}) and this "
                    "process has no codec configured (SAGA_CODEC__KEYS)",
                ) from None
            raise
    paths = data.pop(MARKER, None)
    for path in paths or ():
        holder, key = _slot(data, path)
        if holder is None:
            continue
        marker = holder.get(key)
        try:
            if chain is None:
                raise CodecError(CodecFailure.NOT_CONFIGURED, "no codec configured")
            holder[key] = chain.open(marker)
        except CodecError as exc:
            if undecodable is Undecodable.RAISE:
                raise
            holder[key] = describe(marker, exc.failure)
    return event_from_dict(data)


def seal_error(chain: CodecChain, error: JsonDict | None) -> JsonDict | None:
    """A saga's error (``sagas.error``) with its details sealed: its type, message and
    step stay clear for listings; details can hold a refused step's reply payload."""
    if error is None or not error.get("details"):
        return error
    return {**error, "details": chain.seal(error["details"])}


def open_error(chain: CodecChain | None, error: JsonDict) -> JsonDict:
    """``seal_error`` undone; details this process cannot decode are shown as encrypted
    (a saga's error is only ever displayed, never acted on)."""
    details = error.get("details")
    if not is_marker(details):
        return error
    try:
        if chain is None:
            raise CodecError(CodecFailure.NOT_CONFIGURED, "no codec configured")
        opened = chain.open(details)
    except CodecError as exc:
        opened = describe(details, exc.failure)
    return {**error, "details": opened}


# --------------------------------------------------------------------------- archives

#: The first bytes of an archived history (``saga_archive.history``, an archive file)
#: encoded by a chain: the magic, the chain's name, a newline, the chain's output.
ARCHIVE_MAGIC: Final = b"saga-codec:"


def seal_archive(chain: CodecChain, blob: bytes) -> bytes:
    """An archive blob (gzipped exports) encoded whole: retention writes histories it
    read decoded, and they must not land on disk or in ``saga_archive`` in clear."""
    return ARCHIVE_MAGIC + chain.header + b"\n" + chain.encode(blob)


def open_archive(chain: CodecChain | None, blob: bytes) -> bytes:
    """The gzipped exports of an archive blob, sealed or not."""
    if not blob.startswith(ARCHIVE_MAGIC):
        return blob
    head, _, rest = blob.partition(b"\n")
    name = head[len(ARCHIVE_MAGIC) :].decode(errors="replace")
    if chain is None:
        raise CodecError(
            CodecFailure.NOT_CONFIGURED,
            f"the archive is encoded ({name}) and this process has no codec configured "
            "(SAGA_CODEC__KEYS)",
        )
    return chain.decode(rest, name)


# --------------------------------------------------------------------------- keys


def decode_key(key_id: str, text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise CodecError(
            CodecFailure.BAD_CONFIG, f"key {key_id!r} is not base64", key_id=key_id
        ) from None

"""RFC 4122 UUIDs as text, made without ``uuid.UUID`` objects: every command id (version
5) and every message id (version 4) is one, and the object's int conversions were most of
their cost. Pure but for the random bytes; ``tests/internal/unit/test_ids.py`` checks them
against ``uuid``.

Message ids are drawn from a batch: ``_BATCH`` ids' random bytes read in one
``os.urandom`` (one system call, not one per message) and written as text at once, by
whole columns of the batch. Each id is still 122 bits from ``os.urandom``, used once:
a batch's ids are handed out by one list iterator (a thread never gets another's id),
and a forked child drops the batch it inherited (its parent hands those out)."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable
from typing import Final


def uuid5_text(namespace: uuid.UUID, name: str) -> str:
    """``str(uuid.uuid5(namespace, name))``: the SHA-1 of the namespace and the name."""
    return _text(hashlib.sha1(namespace.bytes + name.encode()).digest()[:16], 5)


def _text(raw: bytes, version: int) -> str:
    """``raw`` with the version and RFC 4122 variant bits set, in the 8-4-4-4-12 form."""
    data = bytearray(raw)
    data[6] = (data[6] & 0x0F) | (version << 4)
    data[8] = (data[8] & 0x3F) | 0x80
    h = data.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


#: Message ids made per ``os.urandom`` call.
_BATCH: Final = 256
#: Each text column of an id (0-35) from its hex column (0-31), the four dashes left out:
#: the 8-4-4-4-12 form. Column 14 is the version (4), column 19 the variant's digit.
_COLUMNS: Final = tuple(
    (text_col, text_col - sum(text_col > dash for dash in (8, 13, 18, 23)))
    for text_col in range(36)
    if text_col not in (8, 13, 18, 23, 14, 19)
)
#: The variant's hex digit from the random one: its two high bits set to ``10``.
_VARIANT: Final = bytes.maketrans(b"0123456789abcdef", b"89ab89ab89ab89ab")


def uuid4_texts(raw: bytes) -> list[str]:
    """The version 4 UUIDs (as text) of ``raw``, 16 bytes each: ``_text(chunk, 4)`` of
    each, written a column at a time for the whole batch."""
    count = len(raw) // 16
    hexed = raw[: 16 * count].hex().encode()
    out = bytearray(36 * count)
    for text_col, hex_col in _COLUMNS:
        out[text_col::36] = hexed[hex_col::32]
    for dash in (8, 13, 18, 23):
        out[dash::36] = b"-" * count
    out[14::36] = b"4" * count
    out[19::36] = hexed[16::32].translate(_VARIANT)
    text = out.decode("ascii")
    return [text[at : at + 36] for at in range(0, 36 * count, 36)]


def _refill() -> str:
    """A new batch of message ids; its first."""
    global _next_id
    _next_id = iter(uuid4_texts(os.urandom(16 * _BATCH))).__next__
    return _next_id()


def _forget() -> None:
    """In a forked child: the parent's batch is the parent's."""
    global _next_id
    _next_id = iter(()).__next__


_next_id: Callable[[], str] = iter(()).__next__
os.register_at_fork(after_in_child=_forget)


def uuid4_text() -> str:
    """``str(uuid.uuid4())``: 16 random bytes (from a batch read at once)."""
    try:
        return _next_id()
    except StopIteration:
        return _refill()

"""RFC 4122 UUIDs as text, made without ``uuid.UUID`` objects: every command id (version
5) and every message id (version 4) is one, and the object's int conversions were most of
their cost. Pure; ``tests/internal/unit/test_ids.py`` checks them against ``uuid``."""

from __future__ import annotations

import hashlib
import os
import uuid


def uuid5_text(namespace: uuid.UUID, name: str) -> str:
    """``str(uuid.uuid5(namespace, name))``: the SHA-1 of the namespace and the name."""
    return _text(hashlib.sha1(namespace.bytes + name.encode()).digest()[:16], 5)


def uuid4_text() -> str:
    """``str(uuid.uuid4())``: 16 random bytes."""
    return _text(os.urandom(16), 4)


def _text(raw: bytes, version: int) -> str:
    """``raw`` with the version and RFC 4122 variant bits set, in the 8-4-4-4-12 form."""
    data = bytearray(raw)
    data[6] = (data[6] & 0x0F) | (version << 4)
    data[8] = (data[8] & 0x3F) | 0x80
    h = data.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

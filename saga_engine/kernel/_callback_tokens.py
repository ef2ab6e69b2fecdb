"""Callback tokens: what ``ctx.callback``'s URL carries, signed so that a third party
completes one saga's wait with no token of its own (docs/callbacks.md).

A token is ``<claims>.<mac>``, both base64url without padding: the claims are the JSON
array ``[1, key_id, saga_id, wait_id, expires]`` (``expires`` in whole seconds since the
epoch), the MAC is HMAC-SHA256 over the claims' text under the key ``key_id`` names
(``CallbackSettings.keys``). Everything in it comes from the saga's history (its id, the
wait's id and expiry, the key id and base URL recorded with the wait), so a replay
derives the same URL; the MAC itself is never stored, so reading a history (a reader's
token) does not give the power to complete its waits.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson

from saga_engine.kernel._errors import CallbackGone, CallbackTokenInvalid
from saga_engine.kernel._settings import CallbackSettings

_VERSION = 1
#: Longer tokens are refused before anything is decoded (a saga id is at most 200
#: characters, a wait id a name and a number).
MAX_TOKEN_CHARS = 1024
_DOMAIN = b"saga-engine callback v1\n"


@dataclass(frozen=True, slots=True)
class CallbackClaims:
    """What a callback token binds: one wait of one saga, until ``expires_at``, signed
    with ``key_id``."""

    saga_id: str
    wait_id: str
    expires_at: datetime
    key_id: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    """The bytes of canonical base64url only: text that decodes leniently (other
    characters, unused bits set) is refused, so a token has one spelling."""
    if not text or not text.isascii():
        raise ValueError("empty or not ASCII")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(data) != text:
        raise ValueError("not canonical base64url")
    return data


def _mac(settings: CallbackSettings, key_id: str, claims: str) -> bytes:
    key = settings.keys.get(key_id)
    if key is None:
        raise CallbackTokenInvalid(
            f"callback key {key_id!r} is not configured here (callbacks.keys); a retired key's "
            "URLs no longer work"
        )
    secret = key.get_secret_value().encode()
    return hmac.new(secret, _DOMAIN + claims.encode("ascii"), hashlib.sha256).digest()


def sign(settings: CallbackSettings, claims: CallbackClaims) -> str:
    """The token of ``claims``; CallbackTokenInvalid when its key is not configured."""
    expires = int(claims.expires_at.timestamp())
    text = _b64(orjson.dumps([_VERSION, claims.key_id, claims.saga_id, claims.wait_id, expires]))
    return f"{text}.{_b64(_mac(settings, claims.key_id, text))}"


def callback_url(base_url: str, token: str) -> str:
    """The URL a third party posts to (``/fail`` appended: a failure)."""
    return f"{base_url.rstrip('/')}/callbacks/{token}"


def token_of(url: str) -> tuple[str, bool]:
    """The token in a callback URL (or its ``/fail`` URL: True), for a caller that has
    only the URL (the testing kit)."""
    _, found, tail = url.partition("/callbacks/")
    if not found or not tail:
        raise CallbackTokenInvalid(f"{url!r} is not a callback URL")
    token, _, rest = tail.partition("/")
    if rest not in ("", "fail"):
        raise CallbackTokenInvalid(f"{url!r} is not a callback URL")
    return token, rest == "fail"


def verify(settings: CallbackSettings, token: str, now: datetime) -> CallbackClaims:
    """The claims of a token this deployment signed. CallbackTokenInvalid for one it did
    not (malformed, an unknown key id, a MAC that does not match); CallbackGone for one
    past its expiry. The MAC is checked before the claims are trusted."""
    if len(token) > MAX_TOKEN_CHARS or token.count(".") != 1:
        raise CallbackTokenInvalid("not a callback token")
    text, mac_text = token.split(".")
    try:
        raw = orjson.loads(_unb64(text))
        mac = _unb64(mac_text)
    except (ValueError, binascii.Error, orjson.JSONDecodeError):
        raise CallbackTokenInvalid("not a callback token") from None
    if not (
        isinstance(raw, list)
        and len(raw) == 5
        and raw[0] == _VERSION
        and all(isinstance(v, str) for v in raw[1:4])
        and type(raw[4]) is int
    ):
        raise CallbackTokenInvalid("not a callback token")
    _, key_id, saga_id, wait_id, expires = raw
    if not hmac.compare_digest(mac, _mac(settings, key_id, text)):
        raise CallbackTokenInvalid("the callback token's signature does not match")
    try:
        expires_at = datetime.fromtimestamp(expires, UTC)
    except (OverflowError, OSError, ValueError):
        raise CallbackTokenInvalid("not a callback token") from None
    if now >= expires_at:
        raise CallbackGone(f"the callback URL expired at {expires_at.isoformat()}")
    return CallbackClaims(saga_id, wait_id, expires_at, key_id)

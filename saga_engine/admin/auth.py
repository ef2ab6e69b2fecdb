"""Bearer-token authentication and the two roles, as a pure ASGI middleware.

Auth runs before routing and before any byte of the body is read, so an anonymous
caller learns nothing (not even whether a path exists) and costs nothing.

- ``reader`` tokens may use the safe methods (GET, HEAD, OPTIONS);
- ``operator`` tokens may use everything.

Tokens are kept only as SHA-256 digests and compared in constant time against every
configured digest; they never appear in a log line, an error or a response.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass
from enum import StrEnum

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from saga_engine._errors import PermanentError
from saga_engine.settings import AdminSettings

#: Paths anyone may read: liveness and the API description (it holds no secret).
PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/ui/login"})
#: The browser UI's session: the bearer token in an HttpOnly, SameSite=Strict cookie.
COOKIE = "saga_admin_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MIN_TOKEN_LENGTH = 16
#: Where the middleware leaves the caller for the endpoints (``request.state.principal``).
PRINCIPAL_KEY = "principal"


class AdminConfigError(PermanentError):
    """The admin API's settings cannot work; the message says what to change."""


class InsecureAdminBinding(AdminConfigError):
    """Refusing to serve the admin API beyond loopback without authentication."""


class Role(StrEnum):
    READER = "reader"
    OPERATOR = "operator"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the token's configured name and its role."""

    name: str
    role: Role

    @property
    def may_act(self) -> bool:
        return self.role is Role.OPERATOR


#: The caller when auth is off (loopback, no tokens configured).
LOCAL_PRINCIPAL = Principal("local", Role.OPERATOR)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and ``localhost``; everything else (0.0.0.0, names) is not."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


class TokenTable:
    """The configured tokens, as digests, with the principal each belongs to."""

    def __init__(self, settings: AdminSettings) -> None:
        entries: list[tuple[bytes, Principal]] = []
        names: set[str] = set()
        for role, table in ((Role.READER, settings.readers), (Role.OPERATOR, settings.operators)):
            for name, secret in table.items():
                # Messages name the principal, never the token.
                if not name.strip() or len(name) > 100:
                    raise AdminConfigError(
                        f"admin {role.value} names must be 1 to 100 characters, got {len(name)}"
                    )
                if name in names:
                    raise AdminConfigError(
                        f"admin principal {name!r} is configured twice; give each token its "
                        "own name"
                    )
                names.add(name)
                token = secret.get_secret_value()
                if len(token) < MIN_TOKEN_LENGTH or token != token.strip():
                    raise AdminConfigError(
                        f"the admin token of {role.value} {name!r} is too weak: use at least "
                        f"{MIN_TOKEN_LENGTH} characters without surrounding spaces, e.g. "
                        "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
                    )
                digest = _digest(token)
                if any(hmac.compare_digest(digest, d) for d, _ in entries):
                    raise AdminConfigError(
                        f"the admin token of {role.value} {name!r} is also another principal's "
                        "token; every principal needs a token of its own"
                    )
                entries.append((digest, Principal(name, role)))
        self._entries = tuple(entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The principal whose token is in an ``Authorization: Bearer ...`` header."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        presented = _digest(token)
        found: Principal | None = None
        for digest, principal in self._entries:  # no early exit: constant time in the match
            if hmac.compare_digest(presented, digest):
                found = principal
        return found


def auth_required(settings: AdminSettings) -> TokenTable | None:
    """The token table, or None when auth is off (loopback and no tokens).

    Raises InsecureAdminBinding when bound beyond loopback with no tokens, and
    AdminConfigError for unusable tokens.
    """
    table = TokenTable(settings)
    if table:
        return table
    if is_loopback(settings.host):
        return None
    raise InsecureAdminBinding(
        f"refusing to serve the admin API on {settings.host!r} without authentication: "
        "bind it to 127.0.0.1 (SAGA_ADMIN__HOST) or configure bearer tokens "
        '(SAGA_ADMIN__OPERATORS=\'{"name": "<token>"}\', SAGA_ADMIN__READERS=...)'
    )


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _cookie(raw: str) -> str:
    for part in raw.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE:
            return value
    return ""


def _same_origin(headers: Headers) -> bool:
    origin = headers.get("origin")
    host = headers.get("host", "")
    if origin is None:
        return False
    return origin.split("://", 1)[-1] == host


class AuthMiddleware:
    """Authenticates every request but the public ones and enforces the role by method."""

    def __init__(self, app: ASGIApp, tokens: TokenTable | None) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        principal: Principal | None = LOCAL_PRINCIPAL
        if self.tokens is not None and scope["path"] not in PUBLIC_PATHS:
            headers = Headers(scope=scope)
            header = headers.get("authorization")
            from_cookie = False
            if not header:
                cookie = _cookie(headers.get("cookie", ""))
                if cookie:
                    header, from_cookie = f"Bearer {cookie}", True
            if from_cookie and scope["method"] not in SAFE_METHODS and not _same_origin(headers):
                # A cookie is sent by the browser on its own: a state-changing request
                # carrying one must come from this very origin (CSRF guard, on top of
                # SameSite=Strict and the JSON-only request bodies).
                response = _error(403, "cross-origin request refused")
                await response(scope, receive, send)
                return
            principal = self.tokens.authenticate(header)
            if principal is None:
                challenge = 'Bearer realm="saga-admin"'
                if header:
                    challenge += ', error="invalid_token"'
                response = _error(
                    401,
                    "a valid bearer token is required (Authorization: Bearer <token>)"
                    if not header
                    else "the bearer token is not valid",
                    {"WWW-Authenticate": challenge},
                )
                await response(scope, receive, send)
                return
            if scope["method"] not in SAFE_METHODS and not principal.may_act:
                response = _error(
                    403, f"{principal.name!r} has the reader role; this action needs an operator"
                )
                await response(scope, receive, send)
                return
        scope.setdefault("state", {})[PRINCIPAL_KEY] = principal
        await self.app(scope, receive, send)

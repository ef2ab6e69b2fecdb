"""Authentication and the two roles, as a pure ASGI middleware.

Auth runs before routing and before any byte of the body is read, so an anonymous
caller learns nothing (not even whether a path exists) and costs nothing.

- ``reader`` tokens may use the safe methods (GET, HEAD, OPTIONS);
- ``operator`` tokens may use everything.

Tokens are kept only as SHA-256 digests and compared in constant time against every
configured digest; they never appear in a log line, an error or a response.

API clients send ``Authorization: Bearer <token>``. The web page signs in once
(``POST /ui/login`` with a token) and then rides on a session cookie, never on the token:

- the cookie is an itsdangerous-signed, timestamped value holding the principal's name,
  its role, a random session id and a keyed fingerprint of the token it was made from.
  It is signed, not encrypted: it holds nothing secret;
- the signing key is ``SAGA_ADMIN__SESSION_SECRET`` when set, else derived from the
  digests of *all* configured tokens: every instance with the same tokens accepts the
  same sessions, and knowing one token is not enough to forge a session;
- a session ends when unused for ``SAGA_ADMIN__SESSION_IDLE_S`` (sliding: a request
  made with it re-issues the cookie once it is older than a minute), when its token is
  rotated or removed (its fingerprint matches no token any more), or at
  ``POST /ui/logout``, which also records its id as revoked *in this process* until it
  would have expired anyway (other instances accept it until then);
- a state-changing request carrying the cookie, and any sign-in or sign-out, must come
  from this very origin (``Origin`` equal to ``Host``; a missing ``Origin`` is refused).

A ``GET`` of a ``/ui`` page without a valid session is redirected to the sign-in form;
everywhere else the answer is a JSON 401.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import time
from base64 import urlsafe_b64encode
from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum
from http.cookies import SimpleCookie
from typing import Any

from itsdangerous import BadData, URLSafeTimedSerializer
from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import cookie_parser
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from saga_engine.admin._http_errors import HttpMiddleware
from saga_engine.kernel._errors import AdminConfigError, InsecureAdminBinding
from saga_engine.kernel._settings import AdminSettings

#: Paths anyone may use: liveness, the API description, signing in and out, and the
#: page's CSS and script (none of them holds a secret; the sign-in form needs the CSS);
#: and callback URLs, whose signed token is their credential (``_callbacks``).
PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/ui/login", "/ui/logout"})
PUBLIC_PREFIXES = ("/ui/static/", "/callbacks/")
#: Sign-in and sign-out change the browser's session: same-origin only, like actions.
SESSION_PATHS = frozenset({"/ui/login", "/ui/logout"})
#: The web page's session cookie (a signed session, never the token).
COOKIE = "saga_admin_session"
#: Earlier versions kept the raw token in this cookie; signing in or out deletes it.
LEGACY_COOKIE = "saga_admin_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MIN_TOKEN_LENGTH = 16
#: Where the middleware leaves the caller for the endpoints (``request.state.principal``).
PRINCIPAL_KEY = "principal"
#: The session the request came with (None for a bearer header; unset when auth is off).
SESSION_KEY = "admin_session"
#: The app's :class:`Sessions`, for the sign-in and sign-out endpoints.
SESSIONS_KEY = "admin_sessions"
#: A session cookie is re-issued (sliding expiry) once it is this old; not on every
#: request, so a page's burst of requests does not rewrite the cookie each time.
REFRESH_AFTER_S = 60
#: Instances' clocks may disagree this much: a cookie another instance signed "in the
#: future" by up to this is still a session.
CLOCK_SKEW_S = 60
#: The revocation set's bound. Logging out needs a valid session, so only principals
#: with a token can fill it; past the bound the oldest entry (the soonest to expire
#: anyway) is dropped.
MAX_REVOKED = 10_000
#: Cookie values longer than this are not sessions (ours are about 150 characters).
MAX_COOKIE = 1024
_KEY_LABEL = b"saga-engine admin session key v1"
_SALT = "saga-engine.admin.session"


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


def _lookup(
    entries: tuple[tuple[bytes, Principal], ...], token: str
) -> tuple[bytes, Principal] | None:
    """The digest and principal of ``token``, if it is a configured one."""
    presented = _digest(token)
    found: tuple[bytes, Principal] | None = None
    for digest, principal in entries:  # no early exit: constant time in the match
        if hmac.compare_digest(presented, digest):
            found = digest, principal
    return found


class TokenTable:
    """The configured tokens, as digests, with the principal each belongs to, and the
    web page's :class:`Sessions` signed for exactly this set of tokens."""

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
        # Built (and its secret checked) now, so a bad setting stops the engine at start.
        self.sessions = Sessions(self._entries, settings)

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
        found = _lookup(self._entries, token)
        return found[1] if found is not None else None


def auth_required(settings: AdminSettings) -> TokenTable | None:
    """The token table, or None when auth is off (loopback and no tokens).

    Raises InsecureAdminBinding when bound beyond loopback with no tokens, and
    AdminConfigError for unusable tokens or session secret.
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


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in browser: who, under which session id, signed when (epoch seconds)."""

    principal: Principal
    sid: str
    fingerprint: str
    signed_at: float


class Sessions:
    """Issues and checks the web page's session cookies, and remembers sign-outs.

    One per admin app (its middleware owns it). The revocation set lives in this
    process only; see the module docstring.
    """

    def __init__(
        self, entries: tuple[tuple[bytes, Principal], ...], settings: AdminSettings
    ) -> None:
        self.idle_s = settings.session_idle_s
        # With a short idle timeout, re-issue well before it runs out.
        self.refresh_after_s = max(1, min(REFRESH_AFTER_S, self.idle_s // 2))
        if settings.session_secret is not None:
            secret = settings.session_secret.get_secret_value()
            if len(secret) < MIN_TOKEN_LENGTH or secret != secret.strip():
                raise AdminConfigError(
                    "SAGA_ADMIN__SESSION_SECRET is too weak: use at least "
                    f"{MIN_TOKEN_LENGTH} characters without surrounding spaces"
                )
            material = b"secret\x00" + secret.encode("utf-8", "surrogatepass")
        else:
            # Sorted: the configuration's order must not change the key between instances.
            material = b"tokens\x00" + b"".join(sorted(d for d, _ in entries))
        self._key = hmac.new(_KEY_LABEL, material, hashlib.sha256).digest()
        self._serializer = URLSafeTimedSerializer(
            self._key, salt=_SALT, signer_kwargs={"digest_method": hashlib.sha256}
        )
        self._entries = entries
        self._principals = {self._fingerprint(d): p for d, p in entries}
        self._revoked: OrderedDict[str, float] = OrderedDict()  # sid -> monotonic expiry

    def _fingerprint(self, digest: bytes) -> str:
        # Keyed, so a cookie (which anyone holding it can read) says nothing about the
        # token that an offline guess could check.
        mac = hmac.new(self._key, b"fingerprint\x00" + digest, hashlib.sha256).digest()
        return urlsafe_b64encode(mac[:18]).decode()

    def _dump(self, principal: Principal, sid: str, fingerprint: str) -> str:
        payload = {"n": principal.name, "r": principal.role.value, "s": sid, "f": fingerprint}
        value: str = self._serializer.dumps(payload)
        return value

    def sign_in(self, token: str) -> tuple[Principal, str] | None:
        """A new session for ``token``: its principal and the cookie value, or None."""
        found = _lookup(self._entries, token)
        if found is None:
            return None
        digest, principal = found
        return principal, self._dump(
            principal, secrets.token_urlsafe(16), self._fingerprint(digest)
        )

    def read(self, value: str) -> Session | None:
        """The session in a cookie value; None when tampered with, signed with another
        key, expired, revoked here, or made from a token no longer configured."""
        if not value or len(value) > MAX_COOKIE:
            return None
        try:
            data, signed = self._serializer.loads(value, return_timestamp=True)
        except BadData:
            return None
        if not isinstance(data, dict):
            return None
        name, role, sid, fingerprint = (data.get(k) for k in ("n", "r", "s", "f"))
        if not all(isinstance(v, str) for v in (name, role, sid, fingerprint)):
            return None
        # Checked here rather than by itsdangerous' max_age, which also refuses any
        # cookie signed a second "in the future" by an instance with a faster clock.
        signed_at = signed.timestamp()
        age = time.time() - signed_at
        if age > self.idle_s or age < -CLOCK_SKEW_S:
            return None
        principal = self._principals.get(str(fingerprint))
        if principal is None:
            return None  # the token was rotated or removed
        if principal.name != name or principal.role.value != role:
            return None  # the token now belongs to someone else, or has another role
        if self.revoked(str(sid)):
            return None
        return Session(principal, str(sid), str(fingerprint), signed_at)

    def due(self, session: Session) -> bool:
        """Whether to re-issue the cookie (sliding expiry)."""
        return time.time() - session.signed_at >= self.refresh_after_s

    def renew(self, session: Session) -> str:
        """The same session (same id: a sign-out still ends it), signed now."""
        return self._dump(session.principal, session.sid, session.fingerprint)

    def _prune(self, now: float) -> None:
        # Every entry lives equally long, so insertion order is expiry order.
        while self._revoked:
            sid, expires = next(iter(self._revoked.items()))
            if expires > now:
                break
            del self._revoked[sid]

    def revoke(self, session: Session) -> None:
        """Refuses ``session`` in this process until it would have expired anyway."""
        now = time.monotonic()
        self._prune(now)
        # +2: signatures carry whole seconds, and a renewal may sign it once more.
        self._revoked[session.sid] = now + self.idle_s + 2
        self._revoked.move_to_end(session.sid)
        while len(self._revoked) > MAX_REVOKED:
            self._revoked.popitem(last=False)

    def revoked(self, sid: str) -> bool:
        self._prune(time.monotonic())
        return sid in self._revoked


def is_https(scope: Scope) -> bool:
    return scope.get("scheme") == "https"


def session_cookie(value: str, *, max_age: int, secure: bool, name: str = COOKIE) -> str:
    """A ``Set-Cookie`` value for the session: HttpOnly (no script reads it),
    SameSite=Strict (no other site's page sends it), Secure when served over https."""
    jar: SimpleCookie = SimpleCookie()
    jar[name] = value
    morsel = jar[name]
    morsel["path"] = "/"
    morsel["max-age"] = max_age
    morsel["httponly"] = True
    morsel["samesite"] = "Strict"
    if secure:
        morsel["secure"] = True
    if max_age == 0:
        morsel["expires"] = "Thu, 01 Jan 1970 00:00:00 GMT"
    return morsel.OutputString()


def clear_session(response: Response, scope: Scope) -> None:
    """Expires the session cookie (and the raw-token cookie of earlier versions)."""
    for name in (COOKIE, LEGACY_COOKIE):
        response.headers.append(
            "set-cookie", session_cookie("", max_age=0, secure=is_https(scope), name=name)
        )


def route_path(scope: Scope) -> str:
    """The path below the app's ``root_path`` (what routes and PUBLIC_PATHS name)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and (path == root or path.startswith(root + "/")):
        return path[len(root) :] or "/"
    return path


def relative_redirect(scope: Scope, path: str) -> RedirectResponse:
    """A 303 to ``path`` under the app's root, as a relative Location: never built from
    the Host header, which the client chooses."""
    response = RedirectResponse(f"{scope.get('root_path', '')}{path}", status_code=303)
    response.headers["Cache-Control"] = "no-store"
    return response


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _same_origin(headers: Headers) -> bool:
    origin = headers.get("origin")
    host = headers.get("host", "")
    if origin is None:
        return False
    return origin.split("://", 1)[-1] == host


def _is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


def _is_page(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


class AuthMiddleware(HttpMiddleware):
    """Authenticates every request but the public ones and enforces the role by method."""

    def __init__(self, app: ASGIApp, tokens: TokenTable | None) -> None:
        super().__init__(app)
        self.tokens = tokens

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = route_path(scope), scope["method"]
        headers = Headers(scope=scope)
        state: dict[str, Any] = scope.setdefault("state", {})
        if method not in SAFE_METHODS and path in SESSION_PATHS and not _same_origin(headers):
            # Login CSRF: another site's page must not sign this browser in (as the
            # attacker) or out.
            await _error(403, "cross-origin request refused")(scope, receive, send)
            return
        if self.tokens is None:
            state[PRINCIPAL_KEY] = LOCAL_PRINCIPAL
            await self.app(scope, receive, send)
            return
        sessions = self.tokens.sessions
        state[SESSIONS_KEY] = sessions
        if _is_public(path):
            await self.app(scope, receive, send)
            return
        header = headers.get("authorization")
        session: Session | None = None
        if header:
            principal = self.tokens.authenticate(header)
        else:
            cookie = cookie_parser(headers.get("cookie", "")).get(COOKIE, "")
            if cookie and method not in SAFE_METHODS and not _same_origin(headers):
                # A cookie is sent by the browser on its own: a state-changing request
                # carrying one must come from this very origin (CSRF guard, on top of
                # SameSite=Strict and the JSON-only request bodies).
                await _error(403, "cross-origin request refused")(scope, receive, send)
                return
            session = sessions.read(cookie)
            principal = session.principal if session is not None else None
        if principal is None:
            await _unauthenticated(scope, header, method, path)(scope, receive, send)
            return
        if method not in SAFE_METHODS and not principal.may_act:
            response = _error(
                403, f"{principal.name!r} has the reader role; this action needs an operator"
            )
            await response(scope, receive, send)
            return
        state[PRINCIPAL_KEY] = principal
        state[SESSION_KEY] = session
        if session is not None and sessions.due(session):
            send = _renewing(send, sessions, session, scope)
        await self.app(scope, receive, send)


def _unauthenticated(scope: Scope, header: str | None, method: str, path: str) -> Response:
    """The answer to a request without a valid credential: a person at a browser gets
    the sign-in form, anyone else a 401 with its challenge."""
    if not header and method in ("GET", "HEAD") and _is_page(path):
        return relative_redirect(scope, "/ui/login")
    challenge = 'Bearer realm="saga-admin"'
    if header:
        challenge += ', error="invalid_token"'
    return _error(
        401,
        "a valid bearer token is required (Authorization: Bearer <token>)"
        if not header
        else "the bearer token is not valid",
        {"WWW-Authenticate": challenge},
    )


def _renewing(send: Send, sessions: Sessions, session: Session, scope: Scope) -> Send:
    """``send``, adding the re-signed session cookie to the response (sliding expiry)."""
    cookie = session_cookie(
        sessions.renew(session), max_age=sessions.idle_s, secure=is_https(scope)
    )

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            MutableHeaders(scope=message).append("set-cookie", cookie)
        await send(message)

    return sending

"""The web page's sign-in: a signed session cookie (never the token), idle expiry,
sign-out with revocation, the same-origin guard on sign-in and sign-out, relative
redirects and the anti-framing headers, over real HTTP against a served worker.

Only the Secure-attribute and root_path cases call the app in-process (the worker's
server speaks plain http and has no root_path).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from base64 import b64encode, urlsafe_b64encode
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from itsdangerous import URLSafeTimedSerializer
from pydantic import SecretStr

from saga_engine.admin import create_admin_app
from saga_engine.admin._auth import COOKIE, LEGACY_COOKIE, TokenTable
from saga_engine.settings import AdminSettings, Settings
from saga_engine.testing import SagaTestEnv
from tests.admin.sagas import Noop
from tests.conftest import PgTarget
from tests.served_worker import OPERATOR_TOKEN, READER_TOKEN, real_settings, served_worker
from tests.waiting import eventually

pytestmark = pytest.mark.integration

#: itsdangerous' salt for our sessions: a forger would know it (it is in the source).
SALT = "saga-engine.admin.session"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
ROTATED_READER_TOKEN = "reader-token-ROTATED-9876543210-zz"
SESSION_SECRET = "session-secret-0123456789-abcdefghij"
OTTO_TOKEN = "otto-token-0123456789-abcdefghijk"


# --------------------------------------------------------------------------- helpers


@contextlib.asynccontextmanager
async def browser(url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client that sends exactly the cookies a test gives it: httpx's own jar is
    emptied after every answer, so no cookie rides along by accident."""
    http = httpx.AsyncClient(base_url=url, timeout=30.0)

    async def forget(_: httpx.Response) -> None:
        http.cookies.clear()

    http.event_hooks["response"].append(forget)
    async with http:
        yield http


def jar(value: str) -> dict[str, str]:
    return {"Cookie": f"{COOKIE}={value}"}


def set_cookies(response: httpx.Response) -> dict[str, str]:
    """Each Set-Cookie header of ``response``, by cookie name."""
    out = {}
    for header in response.headers.get_list("set-cookie"):
        out[header.split("=", 1)[0]] = header
    return out


def cookie_value(header: str) -> str:
    return header.split(";", 1)[0].split("=", 1)[1]


def attributes(header: str) -> set[str]:
    return {part.strip().lower() for part in header.split(";")[1:]}


async def sign_in(
    http: httpx.AsyncClient, token: str, *, origin: str | None = None, **headers: str
) -> httpx.Response:
    sent = {**FORM, **headers}
    sent["Origin"] = origin if origin is not None else str(http.base_url).rstrip("/")
    return await http.post("/ui/login", content=f"token={token}", headers=sent)


async def session_of(http: httpx.AsyncClient, token: str) -> str:
    response = await sign_in(http, token)
    assert response.status_code == 303, response.text
    return cookie_value(set_cookies(response)[COOKIE])


def payload(value: str) -> dict[str, Any]:
    """What the cookie says, read without the key (anyone holding it can)."""
    _, data = URLSafeTimedSerializer(b"any key", salt=SALT).loads_unsafe(value)
    assert isinstance(data, dict)
    return data


def forged(data: dict[str, Any], key: bytes) -> str:
    """``data`` signed like a session, with ``key``."""
    signer = URLSafeTimedSerializer(key, salt=SALT, signer_kwargs={"digest_method": hashlib.sha256})
    value: str = signer.dumps(data)
    return value


async def is_session(http: httpx.AsyncClient, value: str) -> bool:
    """Whether the API takes ``value`` for a session; an API 401 otherwise (checked)."""
    response = await http.get("/sagas", headers=jar(value))
    assert response.status_code in (200, 401), response.text
    return response.status_code == 200


async def sent_to_sign_in(http: httpx.AsyncClient, value: str) -> bool:
    """Whether a page GET with ``value`` is redirected to the sign-in form."""
    response = await http.get("/ui/sagas", headers=jar(value))
    assert response.status_code in (200, 303), response.text
    if response.status_code == 303:
        assert response.headers["location"] == "/ui/login"
    return response.status_code == 303


def minted(admin: AdminSettings, token: str) -> str:
    """A session cookie as an instance configured with ``admin`` would sign it."""
    signed_in = TokenTable(admin).sessions.sign_in(token)
    assert signed_in is not None
    return signed_in[1]


def digests(token: str) -> list[str]:
    raw = hashlib.sha256(token.encode()).digest()
    return [raw.hex(), b64encode(raw).decode(), urlsafe_b64encode(raw).decode().rstrip("=")]


# --------------------------------------------------------------------------- the cookie


async def test_the_cookie_is_a_signed_session_not_the_token(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with served_worker(settings, [Noop]) as served, browser(served.url) as http:
        response = await sign_in(http, READER_TOKEN)
        assert response.status_code == 303
        assert response.headers["location"] == "/ui/sagas"
        cookies = set_cookies(response)
        header = cookies[COOKIE]
        value = cookie_value(header)
        # Not the token, nor anything an offline guess at the token could be checked on.
        assert value != READER_TOKEN
        assert READER_TOKEN not in header
        for digest in digests(READER_TOKEN):
            assert digest not in header
        said = payload(value)
        assert set(said) == {"n", "r", "s", "f"}
        assert (said["n"], said["r"]) == ("rita", "reader")
        assert READER_TOKEN not in json.dumps(said)
        assert attributes(header) >= {"httponly", "samesite=strict", "path=/", "max-age=28800"}
        assert "secure" not in attributes(header)  # plain http
        # The raw-token cookie of earlier versions is deleted on the way.
        assert "max-age=0" in attributes(cookies[LEGACY_COOKIE])

        # The session authenticates the pages and the API...
        page = await http.get("/ui/sagas", headers=jar(value))
        assert page.status_code == 200
        assert 'id="signed-in-as">rita (reader)<' in page.text
        assert 'action="/ui/logout"' in page.text
        assert await is_session(http, value)
        # ...with the principal's role: a reader's session cannot act.
        refused = await http.post(
            "/sagas/x/cancel", json={"reason": "r"}, headers={**jar(value), "Origin": served.url}
        )
        assert refused.status_code == 403
        assert "reader role" in refused.text
        # An operator's session acts only from this origin: another site's page (or a
        # request without Origin) riding on the cookie is refused before anything runs.
        operator = await session_of(http, OPERATOR_TOKEN)
        for origin in ({"Origin": "http://evil.example"}, {}):
            foreign = await http.post(
                "/sagas/x/cancel", json={"reason": "r"}, headers={**jar(operator), **origin}
            )
            assert foreign.status_code == 403, origin
            assert "cross-origin" in foreign.text
        mine = await http.post(
            "/sagas/x/cancel", json={"reason": "r"}, headers={**jar(operator), "Origin": served.url}
        )
        assert mine.status_code == 404  # past the guard and the role: no such saga
        # Two sign-ins are two sessions.
        assert payload(await session_of(http, READER_TOKEN))["s"] != said["s"]

        # The token itself in either cookie is no session (the old scheme is gone).
        assert not await is_session(http, READER_TOKEN)
        legacy = await http.get("/sagas", headers={"Cookie": f"{LEGACY_COOKIE}={READER_TOKEN}"})
        assert legacy.status_code == 401


async def test_a_tampered_or_foreign_cookie_is_not_a_session(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with served_worker(settings, [Noop]) as served, browser(served.url) as http:
        value = await session_of(http, READER_TOKEN)
        assert await is_session(http, value)
        data, stamp, signature = value.rsplit(".", 2)
        promoted = payload(value) | {"n": "olivia", "r": "operator"}
        repacked = forged(promoted, b"whatever").rsplit(".", 2)[0]
        # A reader who knows only their own token can derive a key from it alone, or
        # from it and a guess at the operator's.
        own_token_only = AdminSettings(readers={"rita": SecretStr(READER_TOKEN)})
        guessed_operator = AdminSettings(
            readers={"rita": SecretStr(READER_TOKEN)},
            operators={"olivia": SecretStr("a-guess-at-the-operator-token")},
        )
        # First characters: a base64 string's last one may carry only padding bits.
        flipped = "A" if signature[0] != "A" else "B"
        moved = "B" if stamp[0] != "B" else "C"
        bad = {
            "signature flipped": f"{data}.{stamp}.{flipped}{signature[1:]}",
            "promoted to operator": f"{repacked}.{stamp}.{signature}",
            "timestamp moved": f"{data}.{moved}{stamp[1:]}.{signature}",
            "signed with another key": forged(payload(value), os.urandom(32)),
            "promoted and signed with another key": forged(promoted, os.urandom(32)),
            "from the reader's token alone": minted(own_token_only, READER_TOKEN),
            "with a guessed operator token": minted(guessed_operator, READER_TOKEN),
            "guessed operator, as operator": minted(
                guessed_operator, "a-guess-at-the-operator-token"
            ),
            "unsigned": data,
            "garbage": "not.a.session",
            "empty-ish": ".",
        }
        for what, cookie in bad.items():
            assert not await is_session(http, cookie), what
            assert await sent_to_sign_in(http, cookie), what
        # The genuine one still works, and so does one another instance with the same
        # tokens signs: the key depends on the tokens, not on the instance.
        assert await is_session(http, value)
        twin = AdminSettings(
            readers={"rita": SecretStr(READER_TOKEN)},
            operators={"olivia": SecretStr(OPERATOR_TOKEN)},
        )
        assert await is_session(http, minted(twin, OPERATOR_TOKEN))


# --------------------------------------------------------------------------- expiry


async def test_an_unused_session_expires(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    # Whole seconds: a session signed at 12.9 s counts as signed at 12 s, so 2 s (not 1)
    # keeps the first use below safely inside the window.
    settings = real_settings(pg, kafka_bootstrap, unique_id, session_idle_s=2)
    async with served_worker(settings, [Noop]) as served, browser(served.url) as http:
        value = await session_of(http, OPERATOR_TOKEN)
        signed_in = time.monotonic()
        assert await is_session(http, value)
        assert "max-age=2" in attributes(set_cookies(await sign_in(http, OPERATOR_TOKEN))[COOKIE])

        async def expired() -> bool:
            return not await is_session(http, value)

        # The requests re-issue the cookie as it ages (ignored here): using a stale
        # value again does not extend it.
        await eventually(expired, timeout=10)
        gone = time.monotonic()
        assert gone - signed_in > 0.5  # not refused for some other reason right away
        assert await sent_to_sign_in(http, value)


async def test_using_a_session_extends_it(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id, session_idle_s=3)
    async with served_worker(settings, [Noop]) as served, browser(served.url) as http:
        first = await session_of(http, READER_TOKEN)
        renewed: list[str] = []

        async def reissued() -> bool:
            page = await http.get("/ui/sagas", headers=jar(first))
            assert page.status_code == 200
            header = set_cookies(page).get(COOKIE)
            if header is not None:
                assert attributes(header) >= {"httponly", "samesite=strict", "max-age=3"}
                renewed.append(cookie_value(header))
            return bool(renewed)

        # Re-issued once the cookie is old enough: here after a second (half the idle
        # timeout, in whole seconds); a minute with the default 8 hours.
        await eventually(reissued, timeout=10)
        later = renewed[0]
        assert later != first
        assert payload(later)["s"] == payload(first)["s"]  # the same session, signed later

        async def first_expired() -> bool:
            return not await is_session(http, first)

        await eventually(first_expired, timeout=10)
        # Signed a second or more later, the re-issued cookie outlives the first.
        assert await is_session(http, later)


# --------------------------------------------------------------------------- token changes


async def test_rotating_a_token_ends_its_sessions(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    secret = {"session_secret": SecretStr(SESSION_SECRET)}
    before = real_settings(pg, kafka_bootstrap, unique_id, **secret)
    async with served_worker(before, [Noop]) as served, browser(served.url) as http:
        reader = await session_of(http, READER_TOKEN)
        operator = await session_of(http, OPERATOR_TOKEN)
        assert await is_session(http, reader)
    # Rita's token rotated; the same session secret, so the other sessions live on.
    after = real_settings(
        pg,
        kafka_bootstrap,
        unique_id + "b",
        readers={"rita": SecretStr(ROTATED_READER_TOKEN)},
        **secret,
    )
    async with served_worker(after, [Noop]) as served, browser(served.url) as http:
        assert not await is_session(http, reader)
        assert await sent_to_sign_in(http, reader)
        assert await is_session(http, operator)  # a restart alone ends nothing
        assert await is_session(http, await session_of(http, ROTATED_READER_TOKEN))
        # Removing a token ends its sessions too.
        with_otto = AdminSettings(
            readers={"rita": SecretStr(ROTATED_READER_TOKEN)},
            operators={
                "olivia": SecretStr(OPERATOR_TOKEN),
                "otto": SecretStr(OTTO_TOKEN),
            },
            session_secret=SecretStr(SESSION_SECRET),
        )
        assert not await is_session(http, minted(with_otto, OTTO_TOKEN))
        # (while the same configuration's session of a principal still there is fine)
        assert await is_session(http, minted(with_otto, OPERATOR_TOKEN))


async def test_without_a_session_secret_changing_any_token_ends_every_session(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    # The key is derived from all the tokens: the sessions another instance (or this
    # one before a restart) signed under the old set are all refused, not only rita's.
    otto = SecretStr(OTTO_TOKEN)
    old = AdminSettings(
        operators={"olivia": SecretStr(OPERATOR_TOKEN), "otto": otto},
        readers={"rita": SecretStr(READER_TOKEN)},
    )
    rotated = real_settings(
        pg,
        kafka_bootstrap,
        unique_id,
        operators={"olivia": SecretStr(OPERATOR_TOKEN), "otto": otto},
        readers={"rita": SecretStr(ROTATED_READER_TOKEN)},
    )
    async with served_worker(rotated, [Noop]) as served, browser(served.url) as http:
        assert not await is_session(http, minted(old, OPERATOR_TOKEN))
        assert await is_session(http, await session_of(http, OPERATOR_TOKEN))
    # The control: the same tokens, listed in another order, give the same key.
    unchanged = real_settings(
        pg,
        kafka_bootstrap,
        unique_id + "b",
        operators={"otto": otto, "olivia": SecretStr(OPERATOR_TOKEN)},
    )
    async with served_worker(unchanged, [Noop]) as served, browser(served.url) as http:
        assert await is_session(http, minted(old, OPERATOR_TOKEN))


# --------------------------------------------------------------------------- sign-out


async def test_signing_out_clears_and_revokes_the_session(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with served_worker(settings, [Noop]) as served, browser(served.url) as http:
        value = await session_of(http, OPERATOR_TOKEN)
        other = await session_of(http, OPERATOR_TOKEN)  # another browser, same principal
        page = await http.get("/ui/sagas", headers=jar(value))
        assert '<form class="signout" method="post" action="/ui/logout">' in page.text

        # Another site's page cannot sign this browser out, nor can an Origin-less post.
        for origin in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {}):
            refused = await http.post("/ui/logout", headers={**jar(value), **origin})
            assert refused.status_code == 403, origin
            assert "set-cookie" not in refused.headers
            assert await is_session(http, value)

        out = await http.post("/ui/logout", headers={**jar(value), "Origin": served.url})
        assert out.status_code == 303
        assert out.headers["location"] == "/ui/login"
        cleared = set_cookies(out)[COOKIE]
        assert cookie_value(cleared) in ("", '""')
        assert attributes(cleared) >= {"max-age=0", "httponly", "samesite=strict", "path=/"}

        # Replaying the old value is no use: the session id is revoked here.
        assert not await is_session(http, value)
        assert await sent_to_sign_in(http, value)
        action = await http.post(
            "/sagas/x/cancel", json={"reason": "r"}, headers={**jar(value), "Origin": served.url}
        )
        assert action.status_code == 401
        # Only that session: the principal's other one goes on.
        assert await is_session(http, other)
        # Signing out without a session still clears the cookie.
        again = await http.post("/ui/logout", headers={"Origin": served.url})
        assert again.status_code == 303
        assert "max-age=0" in attributes(set_cookies(again)[COOKIE])


# --------------------------------------------------------------------------- origin, redirects


async def test_sign_in_must_come_from_this_origin(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with served_worker(settings, [Noop]) as served, browser(served.url) as http:
        port = served.url.rsplit(":", 1)[1]
        others = ("http://evil.example", "null", f"{served.url}0", f"http://localhost:{port}")
        for origin in others:
            refused = await sign_in(http, OPERATOR_TOKEN, origin=origin)
            assert refused.status_code == 403, origin
            assert "cross-origin" in refused.text
            assert "set-cookie" not in refused.headers
        no_origin = await http.post("/ui/login", content=f"token={OPERATOR_TOKEN}", headers=FORM)
        assert no_origin.status_code == 403
        assert "set-cookie" not in no_origin.headers
        # The same form from this origin works, and a wrong token gets the form again.
        assert (await sign_in(http, OPERATOR_TOKEN)).status_code == 303
        wrong = await sign_in(http, "not-a-token-at-all-0000")
        assert wrong.status_code == 401
        assert "that token is not valid" in wrong.text
        assert "set-cookie" not in wrong.headers


async def test_redirects_are_relative_whatever_the_host(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    evil = {"Host": "evil.example"}
    async with served_worker(settings, [Noop]) as served, browser(served.url) as http:
        value = await session_of(http, READER_TOKEN)
        # The guard compares Origin with Host, so this sign-in passes it: the redirect
        # must still not point at the Host the client chose.
        login = await sign_in(http, READER_TOKEN, origin="http://evil.example", **evil)
        assert login.status_code == 303
        assert login.headers["location"] == "/ui/sagas"
        cases = {
            ("GET", "/ui"): "/ui/login",  # no session
            ("GET", "/ui/"): "/ui/login",
            ("GET", "/ui/sagas"): "/ui/login",
            ("GET", "/ui/sagas/some-saga"): "/ui/login",
            ("POST", "/ui/logout"): "/ui/login",
        }
        for (method, path), location in cases.items():
            headers = {**evil, "Origin": "http://evil.example"} if method == "POST" else evil
            response = await http.request(method, path, headers=headers)
            assert response.status_code == 303, (method, path)
            assert response.headers["location"] == location, (method, path)
        for path in ("/ui", "/ui/"):
            home = await http.get(path, headers={**evil, **jar(value)})
            assert home.status_code == 303
            assert home.headers["location"] == "/ui/sagas"


async def test_pages_send_strangers_to_sign_in_and_the_api_answers_401(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with served_worker(settings, [Noop]) as served, browser(served.url) as http:
        for path in ("/ui/sagas", "/ui/sagas/x", "/ui/sagas?status=running"):
            page = await http.get(path)
            assert page.status_code == 303, path
            assert page.headers["location"] == "/ui/login"
        for path in ("/sagas", "/sagas/x", "/metrics"):
            api = await http.get(path)
            assert api.status_code == 401, path
            assert api.headers["content-type"] == "application/json"
        # A program that sent a wrong token gets the API's answer, on pages too.
        bad = await http.get("/ui/sagas", headers={"Authorization": "Bearer " + "x" * 30})
        assert bad.status_code == 401
        # The sign-in form and its stylesheet need no session.
        assert (await http.get("/ui/login")).status_code == 200
        assert (await http.get("/ui/static/admin.css")).status_code == 200


# --------------------------------------------------------------------------- headers


async def test_every_html_response_forbids_framing(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with served_worker(settings, [Noop]) as served, browser(served.url) as http:
        # ?wait: the saga is created by the inbox's owner; its page exists once it ran.
        started = await http.post(
            "/sagas/noop?wait=20", json={}, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        )
        assert started.status_code == 200, started.text
        saga_id = started.json()["saga_id"]
        value = await session_of(http, OPERATOR_TOKEN)
        html_pages = {
            "sign-in form": await http.get("/ui/login"),
            "refused sign-in": await sign_in(http, "not-a-token-at-all-0000"),
            "list": await http.get("/ui/sagas", headers=jar(value)),
            "saga": await http.get(f"/ui/sagas/{saga_id}", headers=jar(value)),
        }
        for what, response in html_pages.items():
            assert response.headers["content-type"].startswith("text/html"), what
            assert "frame-ancestors 'none'" in response.headers["content-security-policy"], what
            assert response.headers["x-frame-options"] == "DENY", what
            assert response.headers["x-content-type-options"] == "nosniff", what
            assert response.headers["referrer-policy"] == "same-origin", what
        others = {
            "api": await http.get("/sagas", headers=jar(value)),
            "api 401": await http.get("/sagas"),
            "redirect": await http.get("/ui/sagas"),
            "static": await http.get("/ui/static/admin.js"),
            "404": await http.get("/ui/static/nope", headers=jar(value)),
        }
        for what, response in others.items():
            assert response.headers["x-frame-options"] == "DENY", what
            assert response.headers["x-content-type-options"] == "nosniff", what


async def test_the_cookie_is_secure_over_https_and_follows_root_path() -> None:
    # In-process: the worker's server speaks plain http (a TLS proxy would sit in front).
    env = SagaTestEnv(
        [Noop],
        settings=Settings(
            admin=AdminSettings(
                operators={"olivia": SecretStr(OPERATOR_TOKEN)},
                readers={"rita": SecretStr(READER_TOKEN)},
            )
        ),
    )
    app = create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    https = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=https, base_url="https://admin") as http:
        response = await sign_in(http, READER_TOKEN, origin="https://admin")
        assert response.status_code == 303
        header = set_cookies(response)[COOKIE]
        assert "secure" in attributes(header)
        out = await http.post(
            "/ui/logout", headers={**jar(cookie_value(header)), "Origin": "https://admin"}
        )
        assert "secure" in attributes(set_cookies(out)[COOKIE])
    async with httpx.AsyncClient(transport=https, base_url="http://admin") as http:
        plain = await sign_in(http, READER_TOKEN, origin="http://admin")
        assert "secure" not in attributes(set_cookies(plain)[COOKIE])
    # Behind a proxy that mounts the app under a prefix, redirects keep the prefix.
    mounted = httpx.ASGITransport(app=app, root_path="/admin")
    async with httpx.AsyncClient(transport=mounted, base_url="http://admin") as http:
        login = await http.post(
            "/admin/ui/login",
            content=f"token={READER_TOKEN}",
            headers={**FORM, "Origin": "http://admin"},
        )
        assert login.status_code == 303
        assert login.headers["location"] == "/admin/ui/sagas"
        http.cookies.clear()
        stranger = await http.get("/admin/ui/sagas")
        assert stranger.headers["location"] == "/admin/ui/login"
        form = await http.get("/admin/ui/login")
        assert 'action="/admin/ui/login"' in form.text

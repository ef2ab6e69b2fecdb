"""The admin web page: rendered over httpx, and driven in a real headless Chromium.

The browser tests use Debian's ``chromium`` (``/usr/bin/chromium``; `make test` installs it
when missing, through ``scripts/devstack.py tools``) through the Python ``playwright``
package; they never download a browser. Without one they fail, saying how to get it.
"""

from __future__ import annotations

import html
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from saga_engine import SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.settings import AdminSettings, Settings
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.conftest import (
    OPERATOR,
    OPERATOR_TOKEN,
    READER,
    READER_TOKEN,
    Admin,
    admin_settings,
    make_client,
)
from tests.admin.sagas import Credit, Noop, Transfer
from tests.admin.served import served_in_thread
from tests.waiting import eventually_sync

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Playwright

#: The session cookie, by the name a browser sees.
COOKIE = "saga_admin_session"
CHROMIUM = os.environ.get("SAGA_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SCRIPT = "<script>alert('pwned')</script>"


async def compensated_saga(env: SagaTestEnv) -> str:
    """A transfer whose credit is refused once: the debit is refunded, it ends compensated."""
    env.participant("payee").on(Credit, reject="account closed", times=1)
    saga_id = await env.engine.start(Transfer, {"account": "acc-1", "amount": 10})
    status = await env.run_until_settled(SagaRun(env, saga_id, Transfer))
    assert status == SagaStatus.COMPENSATED
    return saga_id


async def waiting_saga(env: SagaTestEnv) -> str:
    saga_id = await env.engine.start(
        Transfer, {"account": "acc-2", "amount": 20, "wait_for_approval": True}
    )
    assert await env.run_until_settled(SagaRun(env, saga_id, Transfer)) == SagaStatus.RUNNING
    return saga_id


# --------------------------------------------------------------------------- rendering


async def test_the_pages_render_and_escape_payloads(admin: Admin) -> None:
    saga_id = await compensated_saga(admin.env)
    hostile = await admin.env.engine.start(Transfer, {"account": SCRIPT, "amount": 1})

    listing = await admin.http.get("/ui/sagas", headers=READER)
    assert listing.status_code == 200
    assert listing.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in listing.headers["content-security-policy"]
    assert saga_id in listing.text
    assert f'href="/ui/sagas/{saga_id}"' in listing.text

    page = await admin.http.get(f"/ui/sagas/{saga_id}", headers=READER)
    assert page.status_code == 200
    assert saga_id in page.text
    assert 'id="saga-status" class="status s-compensated">compensated<' in page.text
    assert f'href="/sagas/{saga_id}/history?download=1"' in page.text
    # The debit ran, the credit was refused, the debit's refund (a compensation) succeeded.
    assert re.search(r'class="bar fwd o-success"[^>]*data-outcome="success"', page.text)
    assert 'class="bar fwd o-refused"' in page.text
    assert 'class="bar comp o-success"' in page.text
    # A finished saga waits for nothing and offers no action.
    assert "Nothing: the saga ended compensated." in page.text
    assert '<form class="action' not in page.text
    assert "No operator action applies to a compensated saga." in page.text
    assert 'rel="icon"' in page.text
    # A waiting one says what for, and offers what applies to it: no resume, no retry.
    waiting = await waiting_saga(admin.env)
    open_page = (await admin.http.get(f"/ui/sagas/{waiting}", headers=READER)).text
    assert "signal &#39;approve&#39; (no deadline)" in open_page
    for action in ("signal", "cancel", "force-compensate"):
        assert f'action="/sagas/{waiting}/{action}"' in open_page, action
    for action in ("resume", "retry", "skip"):
        assert f'action="/sagas/{waiting}/{action}"' not in open_page, action
    assert '<option value="approve"' in open_page
    assert '<option value="other"' in open_page  # every declared signal
    favicon = await admin.http.get("/ui/static/favicon.svg")
    assert favicon.status_code == 200
    assert favicon.headers["content-type"] == "image/svg+xml"

    escaped = await admin.http.get(f"/ui/sagas/{hostile}", headers=READER)
    assert escaped.status_code == 200
    assert SCRIPT not in escaped.text
    assert html.escape(SCRIPT) in escaped.text or "&lt;script&gt;" in escaped.text


async def test_the_list_filters_and_pages(admin: Admin) -> None:
    done = await compensated_saga(admin.env)
    waiting = await waiting_saga(admin.env)
    page = await admin.http.get("/ui/sagas?status=running&type=&q=", headers=READER)
    assert page.status_code == 200
    assert waiting in page.text
    assert done not in page.text
    found = await admin.http.get(f"/ui/sagas?q={done[:8]}", headers=READER)
    assert done in found.text
    assert waiting not in found.text
    assert (await admin.http.get("/ui/sagas?status=bogus", headers=READER)).status_code == 422
    # The error column says why a saga ended as it did; the page can refresh itself.
    assert "StepFailed" in found.text
    assert 'id="auto-refresh"' in page.text
    by_account = await admin.http.get("/ui/sagas?account=acc-2&q=", headers=READER)
    assert waiting in by_account.text
    assert done not in by_account.text

    for n in range(51):
        await admin.env.engine.start(Noop, {}, saga_id=f"zz-{n:03}")
    first = await admin.http.get("/ui/sagas?type=noop&sort=id", headers=READER)
    assert "zz-000" in first.text
    assert "zz-050" not in first.text
    match = re.search(r'<a rel="next" href="([^"]+)"', first.text)
    assert match is not None
    second = await admin.http.get("/ui/sagas" + html.unescape(match.group(1)), headers=READER)
    assert "zz-050" in second.text
    assert "zz-000" not in second.text
    assert 'rel="next"' not in second.text


async def test_the_pages_send_strangers_to_sign_in(admin: Admin) -> None:
    for path in ("/ui/sagas", "/ui/sagas/x"):
        stranger = await admin.http.get(path)
        assert stranger.status_code == 303, path
        assert stranger.headers["location"] == "/ui/login"
    # A program with a wrong token gets the API's 401, pages or not.
    wrong = await admin.http.get("/ui/sagas", headers={"Authorization": "Bearer " + "x" * 30})
    assert wrong.status_code == 401
    assert (await admin.http.get("/ui/sagas/missing", headers=OPERATOR)).status_code == 404
    # The script and stylesheet hold no secret: the sign-in form needs them.
    static = await admin.http.get("/ui/static/admin.js")
    assert static.status_code == 200
    assert "fetch(" in static.text
    assert (await admin.http.get("/ui/static/web.py", headers=READER)).status_code == 404


async def test_signing_in_sets_a_strict_session_cookie_that_authenticates_the_pages(
    admin: Admin,
) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://admin"}
    login_page = await admin.http.get("/ui/login")
    assert login_page.status_code == 200
    assert 'action="/ui/login"' in login_page.text
    bad = await admin.http.post("/ui/login", content="token=nope", headers=form)
    assert bad.status_code == 401
    assert "nope" not in bad.text
    ok = await admin.http.post("/ui/login", content=f"token={READER_TOKEN}", headers=form)
    assert ok.status_code == 303
    assert ok.headers["location"] == "/ui/sagas"
    [cookie] = [c for c in ok.headers.get_list("set-cookie") if c.startswith(f"{COOKIE}=")]
    assert "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    value = cookie.split(";", 1)[0].split("=", 1)[1]
    assert (
        READER_TOKEN not in value
    )  # a signed session, not the token (tests/admin/test_session.py)
    admin.http.cookies.clear()
    jar = {"Cookie": f"{COOKIE}={value}"}
    page = await admin.http.get("/ui/sagas", headers=jar)
    assert page.status_code == 200
    assert "rita (reader)" in page.text
    # The token itself as the cookie is no session.
    stale = await admin.http.get("/ui/sagas", headers={"Cookie": f"{COOKIE}={READER_TOKEN}"})
    assert stale.status_code == 303
    # A state-changing request riding on the cookie must come from this origin...
    body = {"reason": "r"}
    foreign = await admin.http.post(
        "/sagas/x/cancel", json=body, headers={**jar, "Origin": "http://evil.example"}
    )
    assert foreign.status_code == 403
    assert "cross-origin" in foreign.text
    # ...and a reader's session still cannot act.
    same = await admin.http.post(
        "/sagas/x/cancel", json=body, headers={**jar, "Origin": "http://admin"}
    )
    assert same.status_code == 403
    assert "reader role" in same.text


async def test_without_tokens_on_loopback_the_pages_are_open() -> None:
    env = SagaTestEnv([Transfer, Noop], settings=Settings(admin=AdminSettings()))
    saga_id = await waiting_saga(env)
    async with make_client(
        create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    ) as http:
        page = await http.get(f"/ui/sagas/{saga_id}")
    assert page.status_code == 200
    assert "owed" in page.text  # both steps applied: their compensations are owed
    assert "/ui/logout" not in page.text  # nobody signed in, nothing to sign out of


# --------------------------------------------------------------------------- in a browser


async def _seed(env: SagaTestEnv) -> dict[str, str]:
    return {
        "compensated": await compensated_saga(env),
        "waiting": await waiting_saga(env),
        "approval": await waiting_saga(env),
    }


def until_shown(page: object, selector: str, want: str) -> None:
    """Reloads ``page`` until ``selector`` shows ``want`` (the server's work goes on after
    the page's action returned)."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)

    def shown() -> str | None:
        found = page.locator(selector)
        text = found.inner_text() if found.count() else None
        if text != want:
            page.reload()
        return text

    eventually_sync(
        shown,
        until=lambda text: text == want,
        timeout=20,
        interval=0.2,
        what=f"{selector} to show {want!r}",
    )


def _chromium(pw: Playwright) -> Browser:
    """Debian's Chromium, headless; the test fails (never skips) without it."""
    from playwright.sync_api import Error

    if not Path(CHROMIUM).is_file():
        pytest.fail(
            f"no Chromium at {CHROMIUM}: run `make tools` (or `apt-get install -y chromium`) "
            "or set SAGA_TEST_CHROMIUM; never `playwright install`"
        )
    try:
        return pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    except Error as exc:
        pytest.fail(f"Chromium at {CHROMIUM} would not start: {exc}")


def test_the_page_in_headless_chromium(tmp_path: Path) -> None:
    from playwright.sync_api import Dialog, expect, sync_playwright

    # Auth off: loopback and no tokens (browsers send no bearer header).
    settings = Settings(admin=AdminSettings(host="127.0.0.1", port=0))
    started = time.monotonic()
    with served_in_thread(settings, _seed) as served, sync_playwright() as pw:
        browser = _chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            dialogs: list[str] = []

            def answer(dialog: Dialog) -> None:
                dialogs.append(dialog.type)
                if dialog.type == "prompt":
                    dialog.accept("customer called")
                else:
                    dialog.accept()

            page.on("dialog", answer)
            compensated, waiting = served.seeded["compensated"], served.seeded["waiting"]

            page.goto(f"{served.url}/ui/sagas")
            expect(page.locator("h1")).to_have_text("Sagas")
            page.get_by_role("link", name=compensated).click()
            expect(page.locator("#saga-status")).to_have_text("compensated")
            expect(page.locator("#saga-type")).to_have_text("transfer")
            timeline = page.locator("#timeline")
            expect(timeline.locator(".comp-row")).to_have_count(1)
            expect(timeline.locator("rect.bar.comp.o-success")).to_have_count(1)
            expect(timeline.locator("rect.bar.fwd.o-refused")).to_have_count(1)
            expect(page.locator("#events")).to_contain_text("compensation_completed")
            page.screenshot(path=str(tmp_path / "compensated.png"), full_page=True)

            page.goto(f"{served.url}/ui/sagas?status=running")
            page.get_by_role("link", name=waiting).click()
            expect(page.locator("#saga-status")).to_have_text("running")
            expect(page.locator("#owed")).to_contain_text("debit")
            # The page posts the action, then reloads itself: wait for that reload, so
            # the polling reloads below never race it.
            with page.expect_navigation():
                page.locator("#action-cancel").click()
            # The cancel's compensations finish a moment after the action returns.
            until_shown(page, "#saga-status", "cancelled")
            assert dialogs == ["prompt", "confirm"]
            expect(page.locator("#events")).to_contain_text("cancel_requested")
            expect(page.locator("#events")).to_contain_text("customer called")
            # Each history row leads with its gist: who acted, and why.
            expect(page.locator("#events .gist").nth(5)).to_have_text(
                "cancel_requested; by local: 'customer called'"
            )
            expect(page.locator("#action-error")).to_be_hidden()
            shot = tmp_path / "cancelled.png"
            page.screenshot(path=str(shot), full_page=True)

            # The signal action: a payload the signal's model refuses is the API's 422,
            # on the page; a good one is delivered and the saga completes.
            page.goto(f"{served.url}/ui/sagas/{served.seeded['approval']}")
            expect(page.locator("#waiting-for")).to_contain_text("signal 'approve'")
            expect(page.locator("#action-resume")).to_have_count(0)
            page.select_option("#signal-name", "approve")
            page.fill("#signal-payload", '{"by": 7}')
            page.locator("#action-signal").click()
            expect(page.locator("#action-error")).to_contain_text("refused (422)")
            page.fill("#signal-payload", '{"by": "ann"}')
            with page.expect_navigation():
                page.locator("#action-signal").click()
            until_shown(page, "#saga-status", "completed")
            expect(page.locator("#events")).to_contain_text("signal_received")
            expect(page.locator("#waiting-for")).to_contain_text("Nothing")
        finally:
            browser.close()
    for name in ("compensated.png", "cancelled.png"):
        data = (tmp_path / name).read_bytes()
        assert len(data) > 1000, name
        assert data.startswith(PNG_MAGIC), name
    print(f"browser test took {time.monotonic() - started:.1f}s; screenshots in {tmp_path}")


def test_signing_in_acting_and_out_in_headless_chromium() -> None:
    """With tokens: the browser is sent to the form, signs in, acts through its session
    cookie (the real Origin a browser sends passes the same-origin guard), signs out."""
    from playwright.sync_api import Dialog, expect, sync_playwright

    settings = admin_settings(host="127.0.0.1", port=0)
    with served_in_thread(settings, _seed) as served, sync_playwright() as pw:
        browser = _chromium(pw)
        try:
            context = browser.new_context()
            page = context.new_page()

            def answer(dialog: Dialog) -> None:
                dialog.accept("signed-in operator" if dialog.type == "prompt" else None)

            page.on("dialog", answer)
            waiting = served.seeded["waiting"]

            page.goto(f"{served.url}/ui/sagas/{waiting}")
            expect(page).to_have_url(f"{served.url}/ui/login")
            page.fill("#token", "not-the-token-0000000000")
            page.click("#sign-in")
            expect(page.locator(".error")).to_have_text("that token is not valid")
            page.fill("#token", OPERATOR_TOKEN)
            page.click("#sign-in")
            expect(page).to_have_url(f"{served.url}/ui/sagas")
            expect(page.locator("#signed-in-as")).to_have_text("olivia (operator)")
            [cookie] = [c for c in context.cookies() if c["name"] == COOKIE]
            assert cookie["httpOnly"]
            assert cookie["sameSite"] == "Strict"
            assert OPERATOR_TOKEN not in cookie["value"]

            page.get_by_role("link", name=waiting).click()
            expect(page.locator("#saga-status")).to_have_text("running")
            with page.expect_navigation():  # the page reloads itself once the POST is done
                page.locator("#action-cancel").click()
            expect(page.locator("#action-error")).to_be_hidden()
            expect(page.locator("#events")).to_contain_text("cancel_requested")
            expect(page.locator("#events")).to_contain_text("signed-in operator")

            page.click("#logout")
            expect(page).to_have_url(f"{served.url}/ui/login")
            assert not [c for c in context.cookies() if c["name"] == COOKIE]
            page.goto(f"{served.url}/ui/sagas")
            expect(page).to_have_url(f"{served.url}/ui/login")
        finally:
            browser.close()

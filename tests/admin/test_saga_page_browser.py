"""The saga and schedules pages in headless Chromium: a compensation's back-off offers
Retry (and no signal form), a lost command is re-sent from its page, a schedule is
triggered from its page; no console errors (the CSP is unchanged). Screenshots are kept
in ``$SAGA_TEST_SHOTS`` (default: the test's tmp_path) to look at."""

from __future__ import annotations

import os
from pathlib import Path

from saga_engine import SagaStatus
from saga_engine.settings import AdminSettings, Settings
from saga_engine.testing import SagaTestEnv
from tests.admin.sagas import Credit, Refund, Transfer
from tests.admin.served import served_in_thread
from tests.admin.test_web import PNG_MAGIC, _chromium, until_shown


async def _seed(env: SagaTestEnv) -> dict[str, str]:
    env.participant("payee").on(Credit, reject="account closed", times=1)
    env.participant("ledger").on(Refund, retryable="ledger busy", times=1)
    backoff = await env.engine.start(Transfer, {"account": "acc-1", "amount": 10})
    await env.settle()
    env.participant("payee").on(Credit, no_reply=True, times=1)
    lost = await env.engine.start(Transfer, {"account": "acc-2", "amount": 20})
    await env.settle()
    assert (await env.engine.get(backoff)).status == SagaStatus.COMPENSATING
    assert (await env.engine.get(lost)).status == SagaStatus.RUNNING
    return {"backoff": backoff, "lost": lost}


def _until_status(page: object, want: str) -> None:
    until_shown(page, "#saga-status", want)


def test_the_saga_and_schedules_pages_act_in_headless_chromium(tmp_path: Path) -> None:
    from playwright.sync_api import Dialog, expect, sync_playwright

    shots = Path(os.environ.get("SAGA_TEST_SHOTS", str(tmp_path)))
    shots.mkdir(parents=True, exist_ok=True)
    settings = Settings(admin=AdminSettings(host="127.0.0.1", port=0))
    with served_in_thread(settings, _seed) as served, sync_playwright() as pw:
        browser = _chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            dialogs: list[str] = []

            def answer(dialog: Dialog) -> None:
                dialogs.append(dialog.type)
                dialog.accept("ledger is back" if dialog.type == "prompt" else "")

            page.on("dialog", answer)

            # A compensation waiting out its back-off: Retry, no signal form.
            page.goto(f"{served.url}/ui/sagas/{served.seeded['backoff']}")
            expect(page.locator("#saga-status")).to_have_text("compensating")
            expect(page.locator("#signal-name")).to_have_count(0)
            expect(page.locator("#waiting-for")).to_contain_text("after attempt 1")
            expect(page.locator("#waiting-for")).to_contain_text("last error: ledger busy")
            expect(page.locator("#waiting-for .waited")).to_contain_text("waiting")
            page.screenshot(path=str(shots / "backoff.png"), full_page=True)
            with page.expect_navigation():
                page.locator("#action-retry").click()
            _until_status(page, "compensated")

            # A command lost on its way: re-sent from the page, under its id.
            page.goto(f"{served.url}/ui/sagas/{served.seeded['lost']}")
            expect(page.locator("#waiting-for")).to_contain_text("a reply to step 'credit'")
            expect(page.locator("#action-retry")).to_have_text("Retry / re-send step")
            page.screenshot(path=str(shots / "waiting-reply.png"), full_page=True)
            with page.expect_navigation():
                page.locator("#action-retry").click()
            _until_status(page, "completed")
            expect(page.locator("#events")).to_contain_text("retry_requested")
            expect(page.locator("#events")).to_contain_text("ledger is back")

            # A schedule triggered from its page: its last saga, linked with its status.
            created = page.request.post(
                f"{served.url}/schedules",
                data={"id": "nightly", "saga": "noop", "cron": "0 3 * * *", "input": {}},
            )
            assert created.status == 201, created.text()
            page.goto(f"{served.url}/ui/schedules")
            with page.expect_navigation():
                page.locator("tr[data-id=nightly] button.trigger").click()
            until_shown(page, "tr[data-id=nightly] .saga-link .status", "completed")
            with page.expect_navigation():
                page.locator("tr[data-id=nightly] button.pause").click()
            expect(page.locator("tr[data-id=nightly] button.resume")).to_have_count(1)
            page.screenshot(path=str(shots / "schedules.png"), full_page=True)
            assert errors == [], errors
        finally:
            browser.close()
    for name in ("backoff.png", "waiting-reply.png", "schedules.png"):
        data = (shots / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name

"""The saga list in headless Chromium: newest activity on top, the counts per status
above it, what each saga waits for; no console errors. The screenshot is kept in
``$SAGA_TEST_SHOTS`` (default: the test's tmp_path) to look at."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from saga_engine import SagaStatus
from saga_engine.settings import AdminSettings, Settings
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.sagas import Noop, Transfer
from tests.admin.served import served_in_thread
from tests.admin.test_web import PNG_MAGIC, _chromium


async def _seed(env: SagaTestEnv) -> dict[str, str]:
    old = await env.engine.start(Noop, {}, saga_id="zz-oldest")  # sorts last by id
    await env.settle()
    await env.advance(timedelta(minutes=1))
    waiting = await env.engine.start(
        Transfer, {"account": "acc-9", "amount": 1, "wait_for_approval": True}
    )
    assert await env.run_until_settled(SagaRun(env, waiting, Transfer)) == SagaStatus.RUNNING
    await env.advance(timedelta(minutes=1))
    newest = await env.engine.start(Noop, {}, saga_id="aa-newest")  # sorts first by id
    await env.settle()
    return {"old": old, "waiting": waiting, "newest": newest}


def test_the_list_page_in_headless_chromium(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    shots = Path(os.environ.get("SAGA_TEST_SHOTS", str(tmp_path)))
    shots.mkdir(parents=True, exist_ok=True)
    settings = Settings(admin=AdminSettings(host="127.0.0.1", port=0))
    with served_in_thread(settings, _seed) as served, sync_playwright() as pw:
        browser = _chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            ids = served.seeded
            page.goto(f"{served.url}/ui/sagas")
            links = page.locator("table.sagas a.saga-link")
            expect(links).to_have_count(3)
            assert links.all_inner_texts() == [ids["newest"], ids["waiting"], ids["old"]]
            counts = page.locator(".status-counts")
            expect(counts).to_be_visible()
            expect(counts.locator('[data-status="completed"]')).to_have_text("completed 2")
            expect(counts.locator('[data-status="running"]')).to_have_text("running 1")
            waits = page.locator("table.sagas tbody tr").nth(1).locator("td.waiting")
            expect(waits).to_contain_text("approve")
            shot = shots / "list.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.read_bytes().startswith(PNG_MAGIC)
            # A count is a link to that status's list; id order is one choice away.
            counts.locator('[data-status="running"]').click()
            expect(links).to_have_count(1)
            page.goto(f"{served.url}/ui/sagas?sort=id")
            assert links.all_inner_texts() == sorted(ids.values())
            assert errors == []
        finally:
            browser.close()

"""The saga page shows its progress items live (issue 41 §5), in headless Chromium: the
items already there, then one the saga emits while the page is open (no reload), then
the saga's end; an ended saga's page lists its items; no console errors (the CSP is
unchanged: the stream is 'self')."""

from __future__ import annotations

import httpx

from saga_engine.settings import AdminSettings, Settings
from saga_engine.testing import SagaTestEnv
from tests.admin.served import served_in_thread
from tests.admin.test_web import _chromium
from tests.progress.sagas import Order, Tracked


async def _seed(env: SagaTestEnv) -> dict[str, str]:
    held = await env.start(Tracked, Order(hold=True))
    ended = await env.start(Tracked, Order())
    return {"held": held.saga_id, "ended": ended.saga_id}


def test_the_saga_page_shows_progress_live_in_headless_chromium() -> None:
    from playwright.sync_api import expect, sync_playwright

    settings = Settings(admin=AdminSettings(host="127.0.0.1", port=0))
    with (
        served_in_thread(settings, _seed, sagas=[Tracked]) as served,
        sync_playwright() as pw,
    ):
        browser = _chromium(pw)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            held = served.seeded["held"]
            page.goto(f"{served.url}/ui/sagas/{held}")
            items = page.locator("#progress li")
            expect(items).to_have_count(2)
            expect(items.nth(0)).to_contain_text('status {"stage":"reserving"}')
            expect(items.nth(1)).to_contain_text('eta {"minutes":5}')
            expect(page.locator("#progress-state")).to_have_text("2 items, live")
            # The saga moves on while the page stays open: the new items arrive by themselves.
            signal = {"name": "go", "payload": {"stage": "packing"}}
            sent = httpx.post(f"{served.url}/sagas/{held}/signal", json=signal)
            assert sent.is_success, sent.text
            expect(items).to_have_count(4)
            expect(items.nth(2)).to_contain_text('{"stage":"packing"}')
            expect(page.locator("#progress-state")).to_have_text(
                "4 items; the saga ended completed"
            )
            assert [items.nth(i).get_attribute("value") for i in range(4)] == ["1", "2", "3", "4"]

            page.goto(f"{served.url}/ui/sagas/{served.seeded['ended']}")
            expect(page.locator("#progress li")).to_have_count(3)
            expect(page.locator("#progress-state")).to_have_text(
                "3 items; the saga ended completed"
            )
            assert errors == []
        finally:
            browser.close()

"""The saga page shows participants' reports on the steps running now (issue 41 §5), in
headless Chromium: the latest report per command, replaced as the next arrives, gone
once the command's reply is in the history; no console errors."""

from __future__ import annotations

import asyncio

import httpx

from saga_engine.admin._step_board import StepProgressBoard
from saga_engine.settings import AdminSettings, Settings
from saga_engine.testing import SagaTestEnv
from tests.admin.served import served_in_thread
from tests.admin.test_web import _chromium
from tests.internal.admin.test_step_progress_api import report
from tests.progress.sagas import Order, Tracked


def test_the_saga_page_shows_a_running_steps_reports_live_in_headless_chromium() -> None:
    from playwright.sync_api import expect, sync_playwright

    envs: list[SagaTestEnv] = []

    async def seed(env: SagaTestEnv) -> dict[str, str]:
        envs.append(env)
        env.hold(lambda command: command.step == "reserve")
        return {"held": (await env.start(Tracked, Order(hold=True))).saga_id}

    board = StepProgressBoard()
    settings = Settings(admin=AdminSettings(host="127.0.0.1", port=0))
    with (
        served_in_thread(settings, seed, sagas=[Tracked], step_progress=board) as served,
        sync_playwright() as pw,
    ):
        assert served.loop is not None
        loop = served.loop
        saga_id = served.seeded["held"]
        command_id = httpx.get(f"{served.url}/sagas/{saga_id}").json()["in_flight"][0]["command_id"]

        def reported(seq: int) -> None:
            loop.call_soon_threadsafe(board.add, report(saga_id, command_id, seq))

        browser = _chromium(pw)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{served.url}/ui/sagas/{saga_id}")
            expect(page.locator("#progress li")).to_have_count(1)
            steps = page.locator("#step-progress li")
            expect(steps).to_have_count(0)
            reported(1)
            expect(steps).to_have_count(1)
            expect(steps.nth(0)).to_contain_text('reserve (attempt 1) #1 {"pct":10}')
            reported(2)
            expect(steps.nth(0)).to_contain_text('#2 {"pct":20}')
            expect(steps).to_have_count(1)
            # The participant answers: the step's line goes; the saga waits for a signal.
            done = asyncio.run_coroutine_threadsafe(envs[0].release(), loop)
            done.result(timeout=30)
            expect(page.locator("#progress li")).to_have_count(2)
            expect(steps).to_have_count(0)
            expect(page.locator("#step-progress")).to_be_hidden()
            assert errors == []
        finally:
            browser.close()

"""The insights page (``/ui/saga-types/{name}/insights``): the graph drawn on the server
as an SVG (parallel branches stacked), the per-node figures, the SLA with its breaching
runs linked, bad input a clear 4xx; and the page in headless Chromium: the graph drawn,
the numbers present, no console error under the unchanged CSP."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from saga_engine import SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.settings import AdminSettings, Settings
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.conftest import READER, admin_settings, make_client
from tests.admin.sagas import Credit, Noop
from tests.admin.served import served_in_thread
from tests.admin.test_insights import TimedTransfer
from tests.admin.test_web import PNG_MAGIC, _chromium


async def _seed(env: SagaTestEnv) -> dict[str, str]:
    """Three transfers: one refused (compensated), one quick, one past its SLA."""
    env.participant("payee").on(Credit, reject="account closed", times=1)
    ids = {}
    for label, body in (
        ("refused", {"account": "a", "amount": 1}),
        ("quick", {"account": "b", "amount": 2}),
        ("slow", {"account": "c", "amount": 3, "wait_for_approval": True}),
    ):
        ids[label] = await env.engine.start(TimedTransfer, body)
        await env.run_until_settled(SagaRun(env, ids[label], TimedTransfer))
    await env.advance(timedelta(minutes=3))
    await env.signal(ids["slow"], "approve", {"by": "olivia"})
    assert await env.run_until_settled(SagaRun(env, ids["slow"], TimedTransfer)) == (
        SagaStatus.COMPLETED
    )
    return ids


async def test_the_page_shows_graph_figures_and_breaches() -> None:
    env = SagaTestEnv([TimedTransfer, Noop], settings=admin_settings())
    ids = await _seed(env)
    app = create_admin_app(env.engine, env.settings, parts=env.parts)
    async with make_client(app) as http:
        page = await http.get("/ui/saga-types/timed-transfer/insights?window=1d", headers=READER)
        assert page.status_code == 200, page.text
        text = page.text
        assert "Content-Security-Policy" in page.headers
        assert re.search(r'<svg [^>]*id="insight-graph"', text)
        assert re.findall(r'<g class="node[^"]*" data-node="([^"]+)"', text) == [
            "debit",
            "credit",
            "signal:approve",
        ]
        assert '<g class="node hot" data-node="credit"' in text  # refused once
        assert '<strong id="insight-runs">3</strong>' in text
        assert re.search(r'id="insight-sla">SLA 60.0 s: <strong>66.7%</strong>', text)
        assert f'href="/ui/sagas/{ids["slow"]}"' in text
        assert "1\u00d7 account closed" in text  # 1x, the most frequent error
        assert (await http.get("/ui/saga-types/nope/insights", headers=READER)).status_code == 404
        bad = await http.get("/ui/saga-types/noop/insights?window=5m", headers=READER)
        assert bad.status_code == 422
        index = await http.get("/ui/insights", headers=READER)
        assert index.status_code == 303
        assert index.headers["location"] == "/ui/saga-types/noop/insights"
        assert 'id="nav-insights"' in text
        empty = await http.get("/ui/saga-types/noop/insights", headers=READER)
        assert 'id="no-runs"' in empty.text


def test_the_insights_page_in_headless_chromium(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    settings = Settings(admin=AdminSettings(host="127.0.0.1", port=0))
    with (
        served_in_thread(settings, _seed, sagas=(TimedTransfer, Noop)) as served,
        sync_playwright() as pw,
    ):
        browser = _chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(f"{served.url}/ui/saga-types/timed-transfer/insights?window=1d")
            expect(page.locator("h1")).to_contain_text("timed-transfer")
            graph = page.locator("#insight-graph")
            expect(graph).to_be_visible()
            expect(graph.locator("g.node")).to_have_count(3)
            expect(graph.locator("line.edge")).to_have_count(2)
            box = graph.bounding_box()
            assert box is not None
            assert box["width"] > 300
            assert box["height"] > 40
            expect(page.locator("#insight-runs")).to_have_text("3")
            expect(page.locator("#insight-nodes tr[data-node='credit']")).to_contain_text("33.3%")
            expect(page.locator("#insight-sla")).to_contain_text("66.7% of runs within it")
            page.locator("#insight-window").select_option("1h")
            with page.expect_navigation():
                page.get_by_role("button", name="Show").click()
            assert page.url.endswith("window=1h")
            page.locator("a.breach").first.click()
            expect(page.locator("#saga-status")).to_have_text("completed")
            shot = tmp_path / "insights.png"
            page.goto(f"{served.url}/ui/saga-types/timed-transfer/insights?window=1d")
            page.screenshot(path=str(shot), full_page=True)
            assert shot.read_bytes()[:8] == PNG_MAGIC
            assert problems == []
        finally:
            browser.close()

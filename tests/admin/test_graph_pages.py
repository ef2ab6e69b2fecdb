"""A graph saga on the console: its page draws the declared graph with each node's state
(a server-drawn SVG, no script, the CSP unchanged), a saga written as code has no graph
section, and the insights page draws the declared graph, with each node's latency,
beside the observed one; both pages in headless Chromium without a console error."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from saga_engine import SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.settings import AdminSettings, Settings
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.conftest import READER, admin_settings, make_client
from tests.admin.graph_sagas import Do, Fulfil
from tests.admin.sagas import Noop, Transfer
from tests.admin.served import served_in_thread
from tests.admin.test_web import PNG_MAGIC, _chromium

SAGAS = (Fulfil, Transfer, Noop)


async def _seed(env: SagaTestEnv) -> dict[str, str]:
    """A completed graph saga (its charge 2 s), a compensated one, a code-first one."""
    env.hold(lambda c: c.participant == "payments")
    done = await env.engine.start(Fulfil, {"order": "o-1"})
    await env.settle()
    await env.advance(timedelta(seconds=2))
    await env.release()
    assert await env.run_until_settled(SagaRun(env, done, Fulfil)) == SagaStatus.COMPLETED
    env.participant("mailer").on(Do, reject="no mail today", times=1)
    failed = await env.engine.start(Fulfil, {"order": "o-2", "gift": True})
    assert await env.run_until_settled(SagaRun(env, failed, Fulfil)) == SagaStatus.COMPENSATED
    code = await env.engine.start(Transfer, {"account": "a", "amount": 1})
    await env.run_until_settled(SagaRun(env, code, Transfer))
    return {"done": done, "failed": failed, "code": code}


def _node_states(html: str, svg_id: str) -> dict[str, str]:
    svg = re.search(rf'<svg [^>]*id="{svg_id}".*?</svg>', html, re.S)
    assert svg is not None, f"no #{svg_id}"
    return {
        name: state
        for state, name in re.findall(r'<g class="node st-(\w+)" data-node="([^"]+)"', svg[0])
    }


async def test_the_saga_page_draws_the_declared_graph_with_each_nodes_state() -> None:
    env = SagaTestEnv(list(SAGAS), settings=admin_settings())
    ids = await _seed(env)
    app = create_admin_app(env.engine, env.settings, parts=env.parts)
    async with make_client(app) as http:
        page = await http.get(f"/ui/sagas/{ids['failed']}", headers=READER)
        assert page.status_code == 200, page.text
        assert "script-src 'self'" in page.headers["Content-Security-Policy"]
        assert _node_states(page.text, "saga-graph") == {
            "reserve": "undone",
            "charge": "undone",
            "label": "undone",
            "gift": "done",
            "lines": "undone",
            "notify": "failed",
        }
        assert "undone (2 undone)" in page.text  # the fan-out's items
        assert re.findall(r'class="state g-(\w+)"', page.text) == ["done", "failed", "undone"]
        svg = re.search(r'<svg [^>]*id="saga-graph".*?</svg>', page.text, re.S)
        assert svg is not None
        assert svg[0].count('class="edge"') == 6  # one per declared dependency
        assert "<script" not in svg[0]
        assert "each → warehouse (≤ 5)" in svg[0]
        done = await http.get(f"/ui/sagas/{ids['done']}", headers=READER)
        assert set(_node_states(done.text, "saga-graph").values()) == {"done", "skipped"}
        assert "done · 2 s" in done.text  # the charge's latency
        code = await http.get(f"/ui/sagas/{ids['code']}", headers=READER)
        assert code.status_code == 200
        assert 'id="saga-graph"' not in code.text


async def test_the_insights_page_draws_the_declared_graph_beside_the_observed_one() -> None:
    env = SagaTestEnv(list(SAGAS), settings=admin_settings())
    await _seed(env)
    app = create_admin_app(env.engine, env.settings, parts=env.parts)
    async with make_client(app) as http:
        page = await http.get("/ui/saga-types/fulfil/insights?window=1d", headers=READER)
        assert page.status_code == 200, page.text
        declared = re.search(r'<svg [^>]*id="declared-graph".*?</svg>', page.text, re.S)
        assert declared is not None
        assert re.findall(r'data-node="([^"]+)"', declared[0]) == [
            "reserve",
            "charge",
            "label",
            "gift",
            "lines",
            "notify",
        ]
        assert "p95 2 s · 2 sent" in declared[0]  # charge: 2 runs, one of them 2 s
        assert "p95 1 ms · 4 sent" in declared[0]  # lines: 2 items a run
        assert re.search(r'<svg [^>]*id="insight-graph"', page.text)  # the observed one
        code = await http.get("/ui/saga-types/transfer/insights?window=1d", headers=READER)
        assert 'id="declared-graph"' not in code.text


def test_the_graph_pages_in_headless_chromium(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    settings = Settings(admin=AdminSettings(host="127.0.0.1", port=0))
    with (
        served_in_thread(settings, _seed, sagas=SAGAS) as served,
        sync_playwright() as pw,
    ):
        browser = _chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(f"{served.url}/ui/sagas/{served.seeded['failed']}")
            graph = page.locator("#saga-graph")
            expect(graph).to_be_visible()
            expect(graph.locator("g.node")).to_have_count(6)
            expect(graph.locator("line.edge")).to_have_count(6)
            expect(graph.locator("g.st-failed")).to_have_attribute("data-node", "notify")
            box = graph.bounding_box()
            assert box is not None
            assert box["width"] > 600
            expect(page.locator("#graph-legend")).to_contain_text("undone")
            page.screenshot(path=str(tmp_path / "saga-graph.png"), full_page=True)
            assert (tmp_path / "saga-graph.png").read_bytes()[:8] == PNG_MAGIC
            page.goto(f"{served.url}/ui/saga-types/fulfil/insights?window=1d")
            expect(page.locator("#declared-graph g.node")).to_have_count(6)
            expect(page.locator("#insight-graph")).to_be_visible()
            declared = page.locator("#declared-graph").bounding_box()
            observed = page.locator("#insight-graph").bounding_box()
            assert declared is not None
            assert observed is not None
            assert problems == []
        finally:
            browser.close()

"""The insights page by flow policy (``/ui/saga-types/{name}/insights?flow_policy=N``):
one policy's figures, a "by flow policy" table when runs of more than one policy ended
in the window, each policy a link to its own figures; bad values a 422; and the page in
headless Chromium: the links followed, the window changed under a policy."""

from __future__ import annotations

import re

from saga_engine.admin import create_admin_app
from saga_engine.settings import AdminSettings, LimitsSettings, Settings
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import READER, make_client
from tests.admin.sagas import Noop
from tests.admin.served import served_in_thread
from tests.admin.test_insights import TimedTransfer
from tests.admin.test_insights_by_policy import policy_settings, seed_policies
from tests.admin.test_web import _chromium

PAGE = "/ui/saga-types/timed-transfer/insights"


async def test_the_page_by_flow_policy() -> None:
    env = SagaTestEnv([TimedTransfer, Noop], settings=policy_settings())
    await seed_policies(env)
    app = create_admin_app(env.engine, env.settings, parts=env.parts)
    async with make_client(app) as http:
        every = await http.get(PAGE, params={"window": "1d"}, headers=READER)
        assert every.status_code == 200, every.text
        text = every.text
        assert '<strong id="insight-runs">4</strong>' in text
        assert 'id="insight-policy"' not in text  # every policy's runs
        assert re.findall(r'<tr data-policy="(\d+)"', text) == ["1", "2"]
        links = re.findall(r'class="policy-link" href="([^"]+)"', text)
        assert links == [
            f"{PAGE}?window=1d&amp;flow_policy=1",
            f"{PAGE}?window=1d&amp;flow_policy=2",
        ]
        # Each node's p99 and held p99 per policy: signal:approve only policy 2's runs took.
        nodes = text[text.index('id="insight-policy-nodes"') :]
        assert re.findall(r'<tr data-node="([^"]+)"', nodes)[:3] == [
            "debit",
            "credit",
            "signal:approve",
        ]
        assert ">n/a<" in nodes  # policy 1's runs never waited for the signal
        assert ">None<" not in text

        two = await http.get(PAGE, params={"window": "1d", "flow_policy": 2}, headers=READER)
        assert two.status_code == 200, two.text
        text = two.text
        assert re.search(
            r'id="insight-policy">Runs started under flow policy <strong>2</strong>', text
        )
        assert f'id="all-policies" href="{PAGE}?window=1d"' in text
        assert '<strong id="insight-runs">2</strong>' in text
        assert '<input type="hidden" name="flow_policy" value="2">' in text
        assert '<tr data-policy="2" class="selected">' in text
        assert "1\u00d7 account closed" in text  # policy 2's refusal

        one = await http.get(PAGE, params={"window": "1d", "flow_policy": 1}, headers=READER)
        assert '<strong id="insight-runs">2</strong>' in one.text
        assert "account closed" not in one.text.split('id="insight-nodes"')[1]

        none = await http.get(PAGE, params={"flow_policy": 9}, headers=READER)
        assert re.search(r'id="no-runs">No run of this type under flow policy 9 ended', none.text)

        for bad in ("0", "x", "10001"):
            refused = await http.get(PAGE, params={"flow_policy": bad}, headers=READER)
            assert refused.status_code == 422, bad

        # One policy only: no table to compare.
        noop = await http.get("/ui/saga-types/noop/insights", headers=READER)
        assert 'id="insight-policies"' not in noop.text


def test_the_page_by_flow_policy_in_headless_chromium() -> None:
    from playwright.sync_api import expect, sync_playwright

    settings = Settings(
        admin=AdminSettings(host="127.0.0.1", port=0),
        limits=LimitsSettings.model_validate({"policies": {"2": {}}}),
    )
    with (
        served_in_thread(settings, seed_policies, sagas=(TimedTransfer, Noop)) as served,
        sync_playwright() as pw,
    ):
        browser = _chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(f"{served.url}{PAGE}?window=1d")
            table = page.locator("#insight-policies")
            expect(table).to_be_visible()
            expect(table.locator("tbody tr")).to_have_count(2)
            expect(page.locator("#insight-runs")).to_have_text("4")
            with page.expect_navigation():
                table.locator("a.policy-link", has_text="policy 2").click()
            assert page.url.endswith("window=1d&flow_policy=2")
            expect(page.locator("#insight-policy")).to_contain_text("flow policy 2")
            expect(page.locator("#insight-runs")).to_have_text("2")
            # Another window keeps the policy.
            page.locator("#insight-window").select_option("1h")
            with page.expect_navigation():
                page.get_by_role("button", name="Show").click()
            assert page.url.endswith("window=1h&flow_policy=2")
            with page.expect_navigation():
                page.locator("#all-policies").click()
            assert page.url.endswith("window=1h")
            expect(page.locator("#insight-policy")).to_have_count(0)
            assert problems == []
        finally:
            browser.close()

"""The pages of domain events (``/ui/domain-events``) and concurrency keys
(``/ui/concurrency-keys``): their content (newest first, the receivers and queues linked
to the sagas' pages), their filters, hostile payloads and keys escaped, the same auth as
the other pages, the links from a waiting saga's page, and both in headless Chromium."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

from pydantic import BaseModel

from saga_engine import EventSource
from saga_engine.admin import create_admin_app
from saga_engine.settings import AdminSettings, Settings
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR, READER, admin_settings, bearer, make_client
from tests.admin.served import served_in_thread
from tests.admin.test_keys import Hold, OneAtATime
from tests.admin.test_web import PNG_MAGIC, SCRIPT, _chromium
from tests.events.sagas import AwaitPayment, Order, PaymentCaptured, payment_captured


class Note(BaseModel):
    ref: str
    text: str


#: SCRIPT as the pages show it (Jinja's autoescape).
ESCAPED = "&lt;script&gt;alert(&#39;pwned&#39;)&lt;/script&gt;"

notes = EventSource(topic="test.notes", model=Note, key="ref")


def _rows(page: str, cls: str, attr: str) -> list[str]:
    """The ``attr`` of each row of class ``cls``, in the page's order (unescaped)."""
    found = re.findall(rf'<tr class="{cls}[^"]*" [^>]*{attr}="([^"]*)"', page)
    return [html.unescape(v) for v in found]


async def _facts(env: SagaTestEnv) -> dict[str, str]:
    """A saga that received a fact, one still waiting, an unmatched fact, a hostile one."""
    env.participant("shipping").on("Ship", no_reply=True)
    got = await env.engine.start(AwaitPayment, Order(order_id=42, timeout_s=600).model_dump())
    waits = await env.engine.start(AwaitPayment, Order(order_id=43, timeout_s=600).model_dump())
    await env.settle()
    await env.publish_event(
        PaymentCaptured(order_id=7, amount=1), event_id="nobody", source=payment_captured
    )
    await env.advance(timedelta(seconds=1))
    await env.publish_event(Note(ref=SCRIPT, text=SCRIPT), event_id=SCRIPT, source=notes)
    await env.advance(timedelta(seconds=1))
    await env.publish_event(
        PaymentCaptured(order_id=42, amount=5), event_id="cap", source=payment_captured
    )
    return {"got": got, "waits": waits}


async def test_the_domain_events_page_lists_the_facts_and_who_received_them() -> None:
    env = SagaTestEnv(
        [AwaitPayment], settings=admin_settings(), event_sources=[payment_captured, notes]
    )
    ids = await _facts(env)
    app = create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    async with make_client(app) as http:
        page = await http.get("/ui/domain-events", headers=READER)
        assert page.status_code == 200, page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        text = page.text
        assert _rows(text, "fact", "data-event-id") == ["cap", SCRIPT, "nobody"]  # newest first
        cap = text[text.index('data-event-id="cap"') :]
        cap = cap[: cap.index("</tr>")]
        assert f'href="/ui/sagas/{ids["got"]}"' in cap  # received by the first saga
        assert ids["waits"] not in cap
        assert '<span class="state st-unmatched">unmatched</span>' in text
        assert text.count("st-unmatched") == 2  # nobody's, the hostile one
        assert "&#34;amount&#34;: 5" in cap  # the payload, pretty and escaped
        # The hostile fact: source, key, id and payload all escaped, never markup.
        assert SCRIPT not in text
        assert ESCAPED in text
        assert 'id="nav-domain-events"' in text
        assert 'id="nav-keys"' in text

        only = (await http.get("/ui/domain-events?unmatched=true", headers=READER)).text
        assert _rows(only, "fact", "data-event-id") == [SCRIPT, "nobody"]
        assert 'id="filter-unmatched" checked' in only
        by_source = await http.get(
            "/ui/domain-events", params={"source": "PaymentCaptured"}, headers=OPERATOR
        )
        assert _rows(by_source.text, "fact", "data-event-id") == ["cap", "nobody"]
        none = await http.get("/ui/domain-events?source=Nothing", headers=READER)
        assert "No domain event kept that matches these filters." in none.text
        bad = await http.get("/ui/domain-events", params={"source": "a\x00b"}, headers=READER)
        assert bad.status_code == 422

        # The saga still waiting links to the facts of its source.
        waiting = (await http.get(f"/ui/sagas/{ids['waits']}", headers=READER)).text
        assert 'href="/ui/domain-events?source=PaymentCaptured"' in waiting
        assert 'id="wait-key-link"' not in waiting


async def test_the_concurrency_keys_page_shows_holders_and_the_queue() -> None:
    env = SagaTestEnv([OneAtATime], settings=admin_settings())
    env.participant("vault").on(Hold, no_reply=True)  # the holders keep their keys
    first = await env.engine.start(OneAtATime, {"account": "acc-1"})
    second = await env.engine.start(OneAtATime, {"account": "acc-1"})
    third = await env.engine.start(OneAtATime, {"account": "acc-1"})
    hostile = await env.engine.start(OneAtATime, {"account": SCRIPT})
    await env.settle()
    app = create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    async with make_client(app) as http:
        page = await http.get("/ui/concurrency-keys", headers=READER)
        assert page.status_code == 200, page.text
        text = page.text
        # By type, then key ("<" sorts before "a"), each key's holder first, then FIFO.
        assert _rows(text, "slot", "data-saga") == [hostile, first, second, third]
        acc = text[text.index('data-key="acc-1"') :]
        acc = acc[: acc.index("</table>")]
        assert _rows(acc, "slot", "data-saga") == [first, second, third]  # holder, then FIFO
        assert "limit 1 · 1 holding, 2 queued" in acc
        assert re.search(
            rf'holds</span></td>\s*<td><a class="saga-link" href="/ui/sagas/{first}"', acc
        )
        assert re.search(
            rf'queued #2</span></td>\s*<td><a class="saga-link" href="/ui/sagas/{third}"', acc
        )
        assert SCRIPT not in text
        assert ESCAPED in text  # the hostile key, in its data-key and caption

        one = await http.get("/ui/concurrency-keys", params={"key": "acc-1"}, headers=READER)
        assert _rows(one.text, "slot", "data-saga") == [first, second, third]
        typed = await http.get(
            "/ui/concurrency-keys", params={"type": "one-at-a-time", "key": SCRIPT}, headers=READER
        )
        assert _rows(typed.text, "slot", "data-saga") == [hostile]
        other = await http.get("/ui/concurrency-keys?type=nope", headers=OPERATOR)
        assert "No saga holds or waits for a key that matches these filters." in other.text
        bad = await http.get("/ui/concurrency-keys", params={"key": "\x00"}, headers=READER)
        assert bad.status_code == 422

        # A queued saga's page links to its key's queue; its holder's does not.
        queued = (await http.get(f"/ui/sagas/{third}", headers=READER)).text
        link = "/ui/concurrency-keys?type=one-at-a-time&amp;key=acc-1"
        assert f'id="wait-key-link" href="{link}"' in queued
        holder = (await http.get(f"/ui/sagas/{first}", headers=READER)).text
        assert 'id="wait-key-link"' not in holder


async def test_the_pages_need_a_page_user() -> None:
    env = SagaTestEnv([OneAtATime], settings=admin_settings())
    app = create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    async with make_client(app) as http:
        for path in ("/ui/domain-events", "/ui/concurrency-keys"):
            stranger = await http.get(path)
            assert stranger.status_code == 303, path  # a browser: to the sign-in form
            assert stranger.headers["location"] == "/ui/login"
            wrong = await http.get(path, headers=bearer("x" * 40))
            assert wrong.status_code == 401, path
            for who in (READER, OPERATOR):
                assert (await http.get(path, headers=who)).status_code == 200, path


async def _seed(env: SagaTestEnv) -> dict[str, str]:
    env.participant("vault").on(Hold, no_reply=True)
    ids = await _facts(env)
    first = await env.engine.start(OneAtATime, {"account": "acc-1"})
    second = await env.engine.start(OneAtATime, {"account": "acc-1"})
    await env.settle()
    return {**ids, "first": first, "second": second}


def test_the_pages_in_headless_chromium(tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    settings = Settings(admin=AdminSettings(host="127.0.0.1", port=0))  # auth off: loopback
    sagas = (AwaitPayment, OneAtATime)
    with served_in_thread(settings, _seed, sagas=sagas) as served, sync_playwright() as pw:
        browser = _chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            ids = served.seeded
            page.goto(f"{served.url}/ui/sagas/{quote(ids['waits'])}")
            page.locator("#wait-events-link").click()
            expect(page.locator("h1")).to_have_text("Domain events")
            expect(page.locator("#filter-source")).to_have_value("PaymentCaptured")
            expect(page.locator("#facts tr.fact")).to_have_count(2)
            page.goto(f"{served.url}/ui/domain-events")
            expect(page.locator("#facts tr.fact")).to_have_count(3)
            # The hostile payload is text on the page, not a script that ran.
            expect(page.locator("#facts")).to_contain_text(SCRIPT)
            page.locator("#filter-unmatched").check()
            page.get_by_role("button", name="Filter").click()
            expect(page.locator("#facts tr.fact")).to_have_count(2)
            page.goto(f"{served.url}/ui/domain-events")
            page.screenshot(path=str(tmp_path / "domain-events.png"), full_page=True)
            page.get_by_role("link", name=ids["got"]).click()
            expect(page.locator("#saga-id")).to_have_text(ids["got"])

            page.goto(f"{served.url}/ui/sagas/{quote(ids['second'])}")
            expect(page.locator("#waiting-for")).to_contain_text("queued behind saga")
            page.screenshot(path=str(tmp_path / "queued-saga.png"))
            page.locator("#wait-key-link").click()
            expect(page.locator("h1")).to_have_text("Concurrency keys")
            expect(page.locator("#filter-key")).to_have_value("acc-1")
            expect(page.locator("tr.slot")).to_have_count(2)
            expect(page.locator("tr.slot.held")).to_contain_text(ids["first"])
            expect(page.locator("tr.slot.queued")).to_contain_text("queued #1")
            page.screenshot(path=str(tmp_path / "concurrency-keys.png"), full_page=True)
            page.locator("#nav-domain-events").click()
            expect(page.locator("h1")).to_have_text("Domain events")
        finally:
            browser.close()
    for name in ("domain-events.png", "concurrency-keys.png"):
        data = (tmp_path / name).read_bytes()
        assert len(data) > 1000, name
        assert data.startswith(PNG_MAGIC), name
    print(f"screenshots in {tmp_path}")

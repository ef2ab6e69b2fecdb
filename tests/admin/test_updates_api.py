"""``POST /sagas/{id}/updates/{name}`` and ``GET /sagas/{id}/queries/{name}``: results,
refusals (409 with the reason), bad input (422), dedupe by update id, and queries that
write nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from saga_engine.admin import create_admin_app
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR, READER, admin_settings, make_client
from tests.internal.e2e.update_app import Cart, CartIn


@pytest.fixture
async def carts() -> AsyncIterator[tuple[SagaTestEnv, httpx.AsyncClient]]:
    env = SagaTestEnv([Cart], settings=admin_settings())
    env.participant("alpha").on("Apply", reply={"receipt": "r-1"})
    app = create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    async with make_client(app) as http:
        yield env, http


async def _cart(env: SagaTestEnv, limit: int = 100) -> str:
    return (await env.start(Cart, CartIn(customer="ada", limit=limit))).saga_id


async def test_an_update_returns_its_result_and_is_applied_once(
    carts: tuple[SagaTestEnv, httpx.AsyncClient],
) -> None:
    env, http = carts
    saga_id = await _cart(env)
    body = {"input": {"sku": "tea", "price": 30}, "update_id": "u-1", "reason": "phone order"}
    first = await http.post(f"/sagas/{saga_id}/updates/add_item", json=body, headers=OPERATOR)
    assert first.status_code == 200, first.text
    answer = first.json()
    assert answer["result"] == {"items": 1, "total": 30}
    assert (answer["update_id"], answer["principal"], answer["status"]) == (
        "u-1",
        "olivia",
        "running",
    )
    again = await http.post(f"/sagas/{saga_id}/updates/add_item", json=body, headers=OPERATOR)
    assert again.json()["result"] == {"items": 1, "total": 30}
    summary = await http.get(f"/sagas/{saga_id}/queries/summary", headers=READER)
    assert summary.status_code == 200, summary.text
    assert summary.json()["result"] == {"items": ["tea"], "total": 30, "checked_out": False}
    # The history and its gist show the update, who sent it and what it returned.
    history = (await http.get(f"/sagas/{saga_id}/history", headers=READER)).json()
    kinds = [e["kind"] for e in history["events"]]
    assert kinds.count("update_received") == 1
    assert kinds.count("update_completed") == 1
    failed = await http.post(
        f"/sagas/{saga_id}/updates/add_item",
        json={"input": {"sku": "boom", "price": 1}},
        headers=OPERATOR,
    )
    assert failed.status_code == 200
    assert "out of stock" in failed.json()["error"]["message"]


async def test_query_arguments_come_from_the_url(
    carts: tuple[SagaTestEnv, httpx.AsyncClient],
) -> None:
    env, http = carts
    saga_id = await _cart(env)
    await env.update(saga_id, Cart.add_item, {"sku": "tea", "price": 30})
    by_param = await http.get(f"/sagas/{saga_id}/queries/price_with?extra=5", headers=READER)
    assert by_param.json()["result"] == 35
    as_json = await http.get(
        f"/sagas/{saga_id}/queries/price_with", params={"args": '{"extra": 7}'}, headers=READER
    )
    assert as_json.json()["result"] == 37
    bad = await http.get(f"/sagas/{saga_id}/queries/price_with?extra=lots", headers=READER)
    assert bad.status_code == 422, bad.text
    bad_json = await http.get(
        f"/sagas/{saga_id}/queries/price_with", params={"args": "[1]"}, headers=READER
    )
    assert bad_json.status_code == 422, bad_json.text


async def test_refusals_and_bad_input_are_4xx_and_record_nothing(
    carts: tuple[SagaTestEnv, httpx.AsyncClient],
) -> None:
    env, http = carts
    saga_id = await _cart(env, limit=40)
    before = len(await env.engine.history(saga_id))
    url = f"/sagas/{saga_id}/updates"
    over = await http.post(
        f"{url}/add_item", json={"input": {"sku": "tv", "price": 90}}, headers=OPERATOR
    )
    assert over.status_code == 409, over.text
    assert "limit is 40" in over.json()["detail"]
    assert over.json()["error"] == "UpdateRefused"
    unknown = await http.post(f"{url}/nope", json={}, headers=OPERATOR)
    assert unknown.status_code == 422
    assert "declares no update 'nope'" in unknown.text
    invalid = await http.post(
        f"{url}/add_item", json={"input": {"sku": "x", "price": -1}}, headers=OPERATOR
    )
    assert invalid.status_code == 422, invalid.text
    missing = await http.post(f"/sagas/{'0' * 36}/updates/add_item", json={}, headers=OPERATOR)
    assert missing.status_code == 404
    reader = await http.post(f"{url}/clear", json={}, headers=READER)
    assert reader.status_code == 403
    unknown_query = await http.get(f"/sagas/{saga_id}/queries/nope", headers=READER)
    assert unknown_query.status_code == 422
    raising = await http.get(f"/sagas/{saga_id}/queries/average", headers=READER)
    assert raising.status_code == 409
    assert "ZeroDivisionError" in raising.text
    assert len(await env.engine.history(saga_id)) == before
    # Ended: an update is a 409.
    await env.signal(saga_id, "checkout", {})
    ended = await http.post(f"{url}/clear", json={}, headers=OPERATOR)
    assert ended.status_code == 409, ended.text


async def test_the_page_offers_the_updates_and_shows_the_queries(
    carts: tuple[SagaTestEnv, httpx.AsyncClient],
) -> None:
    env, http = carts
    saga_id = await _cart(env)
    await env.update(
        saga_id,
        Cart.add_item,
        {"sku": "<tea>", "price": 30},
        principal="olivia",
        reason="phone order",
    )
    page = (await http.get(f"/ui/sagas/{saga_id}", headers=READER)).text
    # The timeline has the update's bar; the gist names it, who sent it, what it returned.
    assert '<span class="tname">update add_item</span>' in page
    assert "by olivia: &#39;phone order&#39;" in page
    assert "result {&#34;items&#34;:1,&#34;total&#34;:30}" in page
    assert f'action="/sagas/{saga_id}/updates/"' in page
    assert '<option value="add_item"' in page
    assert '<option value="clear"' in page
    assert "&#34;sku&#34;: &#34;&#34;" in page  # an example input of its model
    queries = page[page.index('id="queries"') :]
    assert "summary" in queries
    assert "&lt;tea&gt;" in queries  # the replayed state's answer, escaped
    assert "<td>average</td><td><pre>30.0</pre>" in queries
    empty = await _cart(env)
    empty_page = (await http.get(f"/ui/sagas/{empty}", headers=READER)).text
    assert "ZeroDivisionError" in empty_page  # a query that raises says why
    # Ended: no update form any more; the queries still answer.
    await env.signal(saga_id, "checkout", {})
    ended = (await http.get(f"/ui/sagas/{saga_id}", headers=READER)).text
    assert "/updates/" not in ended
    assert "&lt;tea&gt;" in ended[ended.index('id="queries"') :]

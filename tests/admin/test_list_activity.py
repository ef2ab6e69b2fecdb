"""GET /sagas by last activity (the default): newest first, exact pages through ties,
filters combined with the order, counts per status, waits, parents and attributes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from saga_engine import SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import READER, Admin, admin_settings, make_client
from tests.admin.sagas import Leaf, Middle, Noop, Root, Transfer


async def _pages(admin: Admin, **query: Any) -> tuple[list[str], list[dict[str, Any]]]:
    ids: list[str] = []
    firsts: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {**query, **({"cursor": cursor} if cursor else {})}
        response = await admin.http.get("/sagas", params=params, headers=READER)
        assert response.status_code == 200, response.text
        page = response.json()
        firsts.append(page)
        ids += [i["saga_id"] for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return ids, firsts


async def test_the_list_is_newest_activity_first_and_pages_through_ties(admin: Admin) -> None:
    # Started at the same instant (the test clock stands still): ties, by id descending.
    tied = [await admin.env.engine.start(Noop, {}) for _ in range(5)]
    await admin.env.advance(timedelta(minutes=1))
    waiting = await admin.start(account="w", wait_for_approval=True)
    assert await admin.settle(waiting) == SagaStatus.RUNNING
    await admin.env.advance(timedelta(minutes=1))
    newest = await admin.env.engine.start(Noop, {})
    expected = [newest, waiting, *sorted(tied, reverse=True)]
    for limit in (1, 2, 3, 50):
        ids, pages = await _pages(admin, limit=limit)
        assert ids == expected, limit
        # Counts on the first page only.
        assert pages[0]["counts"] == [
            {"status": "running", "count": 1, "at_least": False},
            {"status": "completed", "count": 6, "at_least": False},
        ]
        assert all(p["counts"] is None for p in pages[1:])
    # The same with sort=activity said; id order on demand.
    assert (await _pages(admin, sort="activity"))[0] == expected
    assert (await _pages(admin, sort="id", limit=2))[0] == sorted(expected)
    [row] = (await _pages(admin, status="running"))[1][0]["items"]
    # What it waits for, by the detail page's rule; its search attributes.
    detail = (await admin.http.get(f"/sagas/{waiting}", headers=READER)).json()
    assert row["waiting_for"] == detail["waiting_for"] != []
    assert row["search_attributes"] == {"account": "w"}
    assert row["activity_at"] == row["updated_at"]
    assert row["parent_id"] is None


async def test_filters_combine_with_the_activity_order(admin: Admin) -> None:
    first = await admin.start(account="a", wait_for_approval=True)
    assert await admin.settle(first) == SagaStatus.RUNNING
    await admin.env.advance(timedelta(minutes=1))
    done = await admin.env.engine.start(Noop, {})
    await admin.env.advance(timedelta(minutes=1))
    second = await admin.start(account="a", wait_for_approval=True)
    assert await admin.settle(second) == SagaStatus.RUNNING
    other = await admin.start(account="b", wait_for_approval=True)
    assert await admin.settle(other) == SagaStatus.RUNNING

    ids, pages = await _pages(admin, account="a", type="transfer", limit=1)
    assert ids == [second, first]
    assert pages[0]["counts"] == [{"status": "running", "count": 2, "at_least": False}]
    # The status filter narrows the list, not its counts (the tabs stay).
    ids, pages = await _pages(admin, status="completed")
    assert ids == [done]
    assert {c["status"]: c["count"] for c in pages[0]["counts"]} == {"running": 3, "completed": 1}
    # A cursor of one order is refused by the other, with a message.
    page = (await admin.http.get("/sagas?limit=1", headers=READER)).json()
    wrong = await admin.http.get(
        "/sagas", params={"sort": "id", "cursor": page["next_cursor"]}, headers=READER
    )
    assert wrong.status_code == 400, wrong.text
    assert "same sort" in wrong.text
    bad = await admin.http.get("/sagas?sort=age", headers=READER)
    assert bad.status_code == 422


async def test_children_name_their_parent_and_roots_hides_them() -> None:
    env = SagaTestEnv([Transfer, Noop, Root, Middle, Leaf], settings=admin_settings())
    app = create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    async with make_client(app) as http:
        admin = Admin(env, app, http)
        root = await env.engine.start(Root, {})
        await env.settle()
        everything = (await http.get("/sagas", headers=READER)).json()["items"]
        parents = {i["saga_id"]: i["parent_id"] for i in everything}
        assert len(parents) == 4  # root, middle, two leaves
        middle = next(i for i, p in parents.items() if p == root)
        assert sorted(p for p in parents.values() if p is not None) == sorted(
            [middle, middle, root]
        )
        ids, pages = await _pages(admin, roots="true")
        assert ids == [root]
        assert pages[0]["counts"] == [{"status": "completed", "count": 1, "at_least": False}]

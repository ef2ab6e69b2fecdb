"""Updates on the real stack: an update recorded through a real engine's admin API, the
engine SIGKILLed, and the saga rebuilt with the update's effect (the participant charges
the total the updates made, once); the same update id answered again with its recorded
result; a query answered from the replayed state without writing."""

from __future__ import annotations

import re

import asyncpg
import httpx
import pytest

from saga_engine import InvalidPayload, SagaStatus, UpdateFailed, UpdateRefused
from saga_engine.client import SagaClient
from tests.internal.e2e.harness import Cluster
from tests.internal.e2e.update_app import AddItem, Cart, CartIn, Checkout
from tests.waiting import eventually

pytestmark = pytest.mark.integration

APP = "tests.internal.e2e.update_app:SAGAS"


def _start_engine(cluster: Cluster, name: str = "engine") -> None:
    cluster._spawn(name, ["-m", "saga_engine", "worker", APP, "--log-level", "INFO"], cluster.env())


async def _admin_url(cluster: Cluster, after: int, name: str = "engine") -> str:
    """The address the engine's admin API announced, the ``after``-th announcement on."""
    found = await eventually(
        lambda: re.findall(r"admin API on (http://\S+)", cluster.log_tail(name, 2000)),
        until=lambda found: len(found) > after,
        timeout=90,
        interval=0.1,
        what=f"{name}'s admin API to start",
        context=lambda: cluster.log_tail(name),
    )
    return str(found[-1])


async def _until_running(cluster: Cluster, saga_id: str) -> None:
    await eventually(
        lambda: cluster.statuses([saga_id]),
        until=lambda found: found.get(saga_id) == SagaStatus.RUNNING,
        timeout=60,
        interval=0.1,
        what=f"saga {saga_id} to run",
        context=lambda: cluster.log_tail("engine"),
    )


async def _charges(cluster: Cluster, saga_id: str) -> list[tuple[str, int]]:
    conn = await asyncpg.connect(cluster.database_dsn)
    try:
        rows = await conn.fetch(
            f'SELECT kind, amount FROM "{cluster.participant_schema("alpha")}".ledger '
            "WHERE saga_id = $1",
            saga_id,
        )
    finally:
        await conn.close()
    return [(r["kind"], r["amount"]) for r in rows]


async def _event_count(cluster: Cluster, saga_id: str) -> int:
    conn = await asyncpg.connect(cluster.database_dsn)
    try:
        count: int = await conn.fetchval(
            f'SELECT count(*) FROM "{cluster.schema}".saga_events WHERE saga_id = $1', saga_id
        )
    finally:
        await conn.close()
    return count


async def test_an_update_survives_a_sigkill_of_the_engine(cluster: Cluster) -> None:
    cluster.start_participant("alpha")
    _start_engine(cluster)
    url = await _admin_url(cluster, 0)
    async with SagaClient(cluster.settings) as client:
        saga_id = await client.start(Cart, CartIn(customer="ada", limit=100))
        await _until_running(cluster, saga_id)
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            for update_id, sku, price in (("u-1", "tea", 30), ("u-2", "jam", 20)):
                answer = await http.post(
                    f"/sagas/{saga_id}/updates/add_item",
                    json={"input": {"sku": sku, "price": price}, "update_id": update_id},
                )
                assert answer.status_code == 200, answer.text
            assert answer.json()["result"] == {"items": 2, "total": 50}
            refused = await http.post(
                f"/sagas/{saga_id}/updates/add_item", json={"input": {"sku": "tv", "price": 99}}
            )
            assert refused.status_code == 409
            assert "limit is 100" in refused.text

        # The engine dies with the updates recorded and nothing else to go on.
        cluster.kill("engine")
        _start_engine(cluster)
        url = await _admin_url(cluster, 1)
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            before = await _event_count(cluster, saga_id)
            summary = await http.get(f"/sagas/{saga_id}/queries/summary")
            assert summary.status_code == 200, summary.text
            assert summary.json()["result"] == {
                "items": ["tea", "jam"],
                "total": 50,
                "checked_out": False,
            }
            assert await _event_count(cluster, saga_id) == before  # the query wrote nothing
            again = await http.post(
                f"/sagas/{saga_id}/updates/add_item",
                json={"input": {"sku": "tea", "price": 30}, "update_id": "u-1"},
            )
            assert again.status_code == 200, again.text
            assert again.json()["result"] == {"items": 1, "total": 30}  # as recorded
            assert await _event_count(cluster, saga_id) == before  # applied once
        await client.signal(saga_id, Cart.checkout, Checkout(note="go"))
        statuses = await cluster.wait_settled([saga_id], timeout=90)
        assert statuses[saga_id] == SagaStatus.COMPLETED
        output = await client.result(saga_id, timeout=10)
    assert output["items"] == ["tea", "jam"]
    assert output["total"] == 50
    # The participant's own table: one charge, of the total the replayed updates made.
    assert await _charges(cluster, saga_id) == [("apply", 50)]


async def test_the_client_updates_and_queries_on_the_real_stack(cluster: Cluster) -> None:
    _start_engine(cluster)
    url = await _admin_url(cluster, 0)
    async with SagaClient(cluster.settings, admin_url=url) as client:
        saga_id = await client.start(Cart, CartIn(customer="ada", limit=100))
        await _until_running(cluster, saga_id)
        added = await client.update(
            saga_id, Cart.add_item, AddItem(sku="tea", price=30), update_id="c-1"
        )
        assert added == {"items": 1, "total": 30}
        assert (
            await client.update(
                saga_id, Cart.add_item, {"sku": "tea", "price": 30}, update_id="c-1"
            )
            == added
        )
        before = await _event_count(cluster, saga_id)
        # Replayed in this process from Postgres: no engine involved, nothing written.
        assert await client.query(saga_id, Cart.summary) == {
            "items": ["tea"],
            "total": 30,
            "checked_out": False,
        }
        assert await client.query(saga_id, "price_with", {"extra": 1}, saga=Cart) == 31
        with pytest.raises(UpdateRefused, match="limit is 100"):
            await client.update(saga_id, Cart.add_item, AddItem(sku="tv", price=99))
        with pytest.raises(InvalidPayload, match="price"):  # checked before it is sent
            await client.update(saga_id, Cart.add_item, {"sku": "tv", "price": 0})
        with pytest.raises(InvalidPayload, match="declares no update"):
            await client.update(saga_id, "nope", {}, saga=Cart)
        with pytest.raises(UpdateFailed, match="out of stock"):
            await client.update(saga_id, Cart.add_item, AddItem(sku="boom", price=1))
        assert await _event_count(cluster, saga_id) == before + 2  # the failed update only


async def test_updates_and_queries_through_either_of_two_engines(cluster: Cluster) -> None:
    """Whichever engine's admin API takes an update, it is applied once through the
    saga's one history; either engine's queries see it at once."""
    cluster.start_participant("alpha")
    for name in ("engine-a", "engine-b"):
        _start_engine(cluster, name)
    await cluster.wait_partitions_taken("engine-a", "engine-b")
    urls = [await _admin_url(cluster, 0, name) for name in ("engine-a", "engine-b")]
    async with SagaClient(cluster.settings) as client:
        carts = [await client.start(Cart, CartIn(customer=f"c{i}", limit=100)) for i in range(4)]
        for saga_id in carts:
            await _until_running(cluster, saga_id)
        async with httpx.AsyncClient(timeout=30) as http:
            for saga_id in carts:
                for i, url in enumerate(urls + urls):
                    answer = await http.post(
                        f"{url}/sagas/{saga_id}/updates/add_item",
                        json={"input": {"sku": f"s{i}", "price": 10}, "update_id": f"{i}"},
                    )
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["result"] == {"items": i + 1, "total": 10 * (i + 1)}
                    for ask in urls:  # read your writes, on either engine
                        summary = await http.get(f"{ask}/sagas/{saga_id}/queries/summary")
                        assert summary.json()["result"]["total"] == 10 * (i + 1), ask
        for saga_id in carts:
            await client.signal(saga_id, Cart.checkout, Checkout())
        statuses = await cluster.wait_settled(carts, timeout=90)
    assert set(statuses.values()) == {SagaStatus.COMPLETED}
    for saga_id in carts:
        assert await _charges(cluster, saga_id) == [("apply", 40)]

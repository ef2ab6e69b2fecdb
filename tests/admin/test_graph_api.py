"""A graph saga through the admin API: ``GET /saga-types/{name}`` with its declared
graph (null for a saga written as code, 404 for an unknown type), ``GET
/sagas/{id}/graph`` with each node's state and latency (404 for a saga written as code),
and the insights' declared graph with each node's latency; every one needs a token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from saga_engine import SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.conftest import READER, Admin, admin_settings, make_client
from tests.admin.graph_sagas import Do, Fulfil
from tests.admin.sagas import Noop, Transfer


@pytest.fixture
async def admin() -> AsyncIterator[Admin]:
    env = SagaTestEnv([Fulfil, Transfer, Noop], settings=admin_settings())
    app = create_admin_app(env.engine, env.settings, parts=env.parts)
    async with make_client(app) as http:
        yield Admin(env, app, http)


async def _fulfil(admin: Admin, **body: object) -> str:
    env = admin.env
    saga_id = await env.engine.start(Fulfil, {"order": "o-1", **body})
    await env.run_until_settled(SagaRun(env, saga_id, Fulfil))
    return saga_id


async def test_a_saga_type_with_its_declared_graph(admin: Admin) -> None:
    response = await admin.http.get("/saga-types/fulfil", headers=READER)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["name"] == "fulfil"
    assert body["versions"] == [1]
    assert body["input_schema"]["title"] == "OrderIn"
    graph = body["graph"]
    assert [n["name"] for n in graph["nodes"]] == [
        "reserve",
        "charge",
        "label",
        "gift",
        "lines",
        "notify",
    ]
    nodes = {n["name"]: n for n in graph["nodes"]}
    assert nodes["label"]["after"] == ["reserve", "charge"]
    assert nodes["gift"]["conditional"] is True
    assert nodes["lines"] == {
        "name": "lines",
        "kind": "each",
        "to": "warehouse",
        "after": ["reserve"],
        "conditional": False,
        "compensable": True,
        "max_items": 5,
        "pivot": False,
        "cost": None,
    }
    assert nodes["charge"]["cost"] == {"cpu": 2.0}
    assert nodes["notify"]["compensable"] is False
    assert sorted(map(tuple, graph["edges"])) == [
        ("charge", "label"),
        ("label", "notify"),
        ("lines", "notify"),
        ("reserve", "gift"),
        ("reserve", "label"),
        ("reserve", "lines"),
    ]
    code = (await admin.http.get("/saga-types/transfer", headers=READER)).json()
    assert code["graph"] is None
    assert code["signals"] == ["approve", "other"]
    assert code["search_attributes"] == ["account"]


async def test_an_unknown_type_is_a_404_naming_the_known_ones(admin: Admin) -> None:
    response = await admin.http.get("/saga-types/nope", headers=READER)
    assert response.status_code == 404
    body = response.json()
    assert body["error"] == "UnknownSagaType"
    assert "'nope'" in body["detail"]
    assert "fulfil" in body["detail"]


async def test_reads_need_a_token(admin: Admin) -> None:
    saga_id = await _fulfil(admin)
    for path in ("/saga-types/fulfil", f"/sagas/{saga_id}/graph", "/saga-types/nope"):
        assert (await admin.http.get(path)).status_code == 401, path


async def test_a_sagas_graph_with_each_nodes_state(admin: Admin) -> None:
    env = admin.env
    env.hold(lambda c: c.participant == "payments")
    saga_id = await env.engine.start(Fulfil, {"order": "o-1"})
    await env.settle()
    response = await admin.http.get(f"/sagas/{saga_id}/graph", headers=READER)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["saga_type"] == "fulfil"
    assert body["status"] == "running"
    assert {n["name"]: n["state"] for n in body["nodes"]} == {
        "reserve": "done",
        "charge": "running",
        "label": "pending",
        "gift": "skipped",
        "lines": "done",
        "notify": "pending",
    }
    await env.advance(timedelta(seconds=2))
    await env.release()
    assert await env.run_until_settled(SagaRun(env, saga_id, Fulfil)) == SagaStatus.COMPLETED
    body = (await admin.http.get(f"/sagas/{saga_id}/graph", headers=READER)).json()
    nodes = {n["name"]: n for n in body["nodes"]}
    assert {name: n["state"] for name, n in nodes.items()} == {
        "reserve": "done",
        "charge": "done",
        "label": "done",
        "gift": "skipped",
        "lines": "done",
        "notify": "done",
    }
    assert nodes["charge"]["latency_ms"] == 2000.0
    assert nodes["lines"]["items"] == {"done": 2}
    assert ["reserve", "lines"] in body["edges"]


async def test_a_failed_graph_saga_shows_what_was_undone(admin: Admin) -> None:
    admin.env.participant("mailer").on(Do, reject="no mail today")
    saga_id = await _fulfil(admin, gift=True)
    body = (await admin.http.get(f"/sagas/{saga_id}/graph", headers=READER)).json()
    assert body["status"] == "compensated"
    assert {n["name"]: n["state"] for n in body["nodes"]} == {
        "reserve": "undone",
        "charge": "undone",
        "label": "undone",
        "gift": "done",
        "lines": "undone",
        "notify": "failed",
    }


async def test_a_saga_written_as_code_has_no_graph(admin: Admin) -> None:
    saga_id = await admin.start()
    response = await admin.http.get(f"/sagas/{saga_id}/graph", headers=READER)
    assert response.status_code == 404
    assert "written as code" in response.json()["detail"]
    missing = await admin.http.get("/sagas/no-such-saga/graph", headers=READER)
    assert missing.status_code == 404


async def test_the_insights_carry_the_declared_graph_with_latency(admin: Admin) -> None:
    env = admin.env
    env.hold(lambda c: c.participant == "warehouse" and c.command_type == "Do")
    saga_id = await env.engine.start(Fulfil, {"order": "o-1"})
    await env.settle()
    await env.advance(timedelta(milliseconds=150))
    await env.release()
    assert await env.run_until_settled(SagaRun(env, saga_id, Fulfil)) == SagaStatus.COMPLETED
    body = (await admin.http.get("/saga-types/fulfil/insights", headers=READER)).json()
    assert body["runs"] == 1
    nodes = {n["name"]: n for n in body["graph"]["nodes"]}
    assert nodes["lines"]["latency_ms"] == {"p50": 200, "p95": 200, "p99": 200}
    assert nodes["lines"]["attempts"] == 2
    assert nodes["reserve"]["latency_ms"]["p50"] == 1  # at once: the first bucket
    assert nodes["gift"]["attempts"] == 0
    assert nodes["gift"]["latency_ms"] == {"p50": None, "p95": None, "p99": None}
    code = (await admin.http.get("/saga-types/transfer/insights", headers=READER)).json()
    assert code["graph"] is None

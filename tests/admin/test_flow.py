"""Flow control seen by an operator: ``GET /flow``, the flow series of ``/metrics``
(JSON and Prometheus), the table of the web page, ``saga flow``, with a budget's use and
the fairness keys' weights; and the start's ``priority`` and ``fairness_key``, recorded
in ``saga_started`` or refused with a 422."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from saga_engine import Cost, Saga, SagaContext
from saga_engine.admin import create_admin_app
from saga_engine.settings import FlowLimit, LimitsSettings, Settings
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR, READER, READER_TOKEN, admin_settings, make_client
from tests.admin.sagas import Debit, Noop, Transfer
from tests.admin.served import Served, served_in_thread
from tests.cli.conftest import as_json, invoke
from tests.waiting import eventually

LIMITS = LimitsSettings(participants={"ledger": FlowLimit(concurrency=1, rate=100)}, aging_s=5)


def limited(**admin: Any) -> Settings:
    return admin_settings(**admin).model_copy(update={"limits": LIMITS})


async def gates(http: Any) -> list[dict[str, Any]]:
    response = await http.get("/flow", headers=READER)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["enabled"] is True
    assert body["aging_s"] == 5
    found: list[dict[str, Any]] = body["gates"]
    return found


async def test_flow_is_visible_in_the_api_metrics_and_page() -> None:
    env = SagaTestEnv([Transfer, Noop], settings=limited())
    env.participant("ledger").on(Debit, no_reply=True)
    app = create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    async with make_client(app) as http:
        for i in range(3):
            response = await http.post(
                f"/sagas/transfer?priority={i}&fairness_key=tenant-{i}",
                json={"account": f"a{i}", "amount": 1},
                headers=OPERATOR,
            )
            assert response.status_code == 202, response.text
        found = await eventually(
            lambda: gates(http), until=lambda found: found[0]["waiting"] == 2, interval=0.01
        )
        assert found == [
            {
                "kind": "participant",
                "name": "ledger",
                "policy": 1,
                "concurrency_limit": 1,
                "rate_limit": 100.0,
                "share": 1.0,
                "policy_share": 1.0,
                "effective_concurrency": 1,
                "effective_rate": 100.0,
                "in_flight": 1,
                "waiting": 2,
                "sent": 1,
                "budget": None,
                "effective_budget": None,
                "budget_in_use": None,
                "adaptive": None,
            }
        ]
        metrics = (await http.get("/metrics", headers=READER)).json()
        assert metrics["flow"] == found
        text = (await http.get("/metrics", headers={**READER, "Accept": "text/plain"})).text
        assert 'saga_flow_waiting{kind="participant",name="ledger",policy="1"} 2' in text
        assert 'saga_flow_in_flight{kind="participant",name="ledger",policy="1"} 1' in text
        assert 'saga_flow_policy_share{kind="participant",name="ledger",policy="1"} 1.0' in text
        page = await http.get("/ui/sagas", headers=READER)
        assert page.status_code == 200
        assert '<td class="waiting">2</td>' in page.text
    recorded = set()
    for saga_id in await env.store.open_saga_ids():
        started = (await env.engine.history(saga_id))[0]
        assert started.kind == "saga_started"
        recorded.add((started.priority, started.fairness_key))
    assert recorded == {(i, f"tenant-{i}") for i in range(3)}


async def test_without_limits_flow_is_off_and_the_page_has_no_table() -> None:
    env = SagaTestEnv([Transfer, Noop], settings=admin_settings())
    async with make_client(
        create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    ) as http:
        body = (await http.get("/flow", headers=READER)).json()
        metrics = (await http.get("/metrics", headers=READER)).json()
        text = (await http.get("/metrics", headers={**READER, "Accept": "text/plain"})).text
        page = (await http.get("/ui/sagas", headers=READER)).text
    assert body == {
        "enabled": False,
        "aging_s": 10.0,
        "fairness_weights": {},
        "policies": [1],
        "gates": [],
    }
    assert metrics["flow"] == []
    assert "saga_flow" not in text
    assert 'class="flow"' not in page


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("priority=high", "priority"),
        ("priority=10000000", "priority"),
        (f"fairness_key={'x' * 201}", "fairness_key"),
        ("fairness_key=", "fairness_key"),
    ],
)
async def test_a_bad_priority_or_fairness_key_is_a_422_and_starts_nothing(
    query: str, field: str
) -> None:
    env = SagaTestEnv([Transfer, Noop], settings=limited())
    async with make_client(
        create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    ) as http:
        response = await http.post(
            f"/sagas/transfer?{query}", json={"account": "a", "amount": 1}, headers=OPERATOR
        )
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["query", field]
    assert await env.store.open_saga_ids() == []


async def _seed(env: SagaTestEnv) -> dict[str, str]:
    env.participant("ledger").on(Debit, no_reply=True)
    ids = {}
    for name in ("one", "two"):
        ids[name] = await env.engine.start(Transfer, {"account": name, "amount": 1})
    return ids


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_in_thread(limited(port=0), _seed) as running:
        yield running


def test_saga_flow_prints_the_limits(served: Served) -> None:
    env = {"SAGA_ADMIN_TOKEN": READER_TOKEN, "SAGA_ADMIN_URL": served.url}
    body = as_json(invoke(["flow", "--json"], env))
    assert body["enabled"] is True
    (gate,) = body["gates"]
    assert (gate["name"], gate["in_flight"], gate["waiting"]) == ("ledger", 1, 1)
    table = invoke(["flow"], env)
    assert table.exit_code == 0, table.output
    assert "ledger" in table.stdout
    assert "1 of 1" in table.stdout


# --------------------------------------------------------------------------- budgets


class Frame(BaseModel):
    n: int = 0


class Rendered(BaseModel):
    ok: bool = True


class Draw(BaseModel):
    n: int


class Render(Saga[Frame, Rendered]):
    name = "render"

    async def run(self, ctx: SagaContext, frame: Frame) -> Rendered:
        await ctx.step(
            "draw", to="renderer", command=Draw(n=frame.n), cost=Cost(cpu=4, gpu=1), timeout=60
        )
        return Rendered()


def budgeted(**admin: Any) -> Settings:
    limits = LimitsSettings(
        participants={"renderer": FlowLimit(budget={"cpu": 8, "gpu": 4})},
        fairness_weights={"gold": 3, "*": 1},
    )
    return admin_settings(**admin).model_copy(update={"limits": limits})


async def _three_frames(env: SagaTestEnv) -> dict[str, str]:
    env.participant("renderer").on(Draw, no_reply=True)
    return {str(n): await env.engine.start(Render, Frame(n=n)) for n in range(3)}


@contextlib.asynccontextmanager
async def two_frames_out(settings: Settings) -> AsyncIterator[tuple[Any, dict[str, Any]]]:
    """Three frames started, two of them sent: the admin API's client, and its gate."""
    env = SagaTestEnv([Render], settings=settings)
    app = create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    async with make_client(app) as http:
        await _three_frames(env)
        (gate,) = await eventually(
            lambda: _gates_of(http), until=lambda found: found[0]["in_flight"] == 2
        )
        yield http, gate


async def test_a_budget_in_use_and_the_weights_are_visible() -> None:
    # cpu 8: two frames of 4 in flight, the third held.
    async with two_frames_out(budgeted()) as (http, gate):
        assert gate["waiting"] == 1
        assert gate["budget"] == {"cpu": 8.0, "gpu": 4.0}
        assert gate["effective_budget"] == {"cpu": 8.0, "gpu": 4.0}
        assert gate["budget_in_use"] == {"cpu": 8.0, "gpu": 2.0}
        body = (await http.get("/flow", headers=READER)).json()
        assert body["fairness_weights"] == {"gold": 3.0, "*": 1.0}
        text = (await http.get("/metrics", headers={**READER, "Accept": "text/plain"})).text
        series = 'kind="participant",name="renderer",policy="1",resource="cpu"'
        assert f"saga_flow_budget_in_use{{{series}}} 8.0" in text
        assert f"saga_flow_budget{{{series}}} 8.0" in text
        page = (await http.get("/ui/sagas", headers=READER)).text
        assert 'data-resource="cpu">cpu 8/8 of 8</span>' in page
        assert '<span class="weight">gold = 3</span>' in page


async def _gates_of(http: Any) -> list[dict[str, Any]]:
    body: dict[str, Any] = (await http.get("/flow", headers=READER)).json()
    found: list[dict[str, Any]] = body["gates"]
    return found


def test_saga_flow_prints_the_budget_in_use_and_the_weights() -> None:
    with served_in_thread(budgeted(port=0), _three_frames, sagas=(Render,)) as running:
        env = {"SAGA_ADMIN_TOKEN": READER_TOKEN, "SAGA_ADMIN_URL": running.url}
        body = as_json(invoke(["flow", "--json"], env))
        assert body["gates"][0]["budget"] == {"cpu": 8.0, "gpu": 4.0}
        table = invoke(["flow"], env)
    assert table.exit_code == 0, table.output
    assert "budget in use" in table.stdout
    assert "of 8" in table.stdout
    assert "gold=3" in table.stdout


# --------------------------------------------------------------------------- adaptive


def adaptive(**admin: Any) -> Settings:
    limits = LimitsSettings(
        participants={
            "renderer": FlowLimit(concurrency="adaptive", min_concurrency=2, max_concurrency=20)
        }
    )
    return admin_settings(**admin).model_copy(update={"limits": limits})


async def test_an_adaptive_limit_and_why_it_moved_are_visible() -> None:
    # It starts at its minimum, 2: the third frame is held.
    async with two_frames_out(adaptive()) as (http, gate):
        assert gate["concurrency_limit"] == "adaptive"
        assert gate["effective_concurrency"] == 2
        assert gate["adaptive"] == {
            "algorithm": "gradient",
            "limit": 2,
            "min": 2,
            "max": 20,
            "cause": "start",
            "reason": "starting at the minimum",
            "baseline_ms": None,
            "recent_ms": None,
            "replies": 0,
            "timeouts": 0,
        }
        text = (await http.get("/metrics", headers={**READER, "Accept": "text/plain"})).text
        assert (
            'saga_flow_adaptive_limit{kind="participant",name="renderer",policy="1",cause="start"} 2'
            in text
        )
        page = (await http.get("/ui/sagas", headers=READER)).text
        assert "adaptive: 2 (2-20), start" in page


def test_saga_flow_prints_an_adaptive_limit() -> None:
    with served_in_thread(adaptive(port=0), _three_frames, sagas=(Render,)) as running:
        env = {"SAGA_ADMIN_TOKEN": READER_TOKEN, "SAGA_ADMIN_URL": running.url}
        table = invoke(["flow"], env)
    assert table.exit_code == 0, table.output
    assert "adaptive 2 (2-20)" in table.stdout

"""Insights split by flow policy through the admin API: ``?flow_policy=N`` reads one
policy's runs, every answer lists the policies that ran in the window, and ``GET
/saga-types/{name}/insights/policies`` puts them side by side; bad values are a 422. On
the in-memory store and on Postgres."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx
import pytest

from saga_engine import SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.settings import LimitsSettings, Settings
from saga_engine.store import PostgresEventStore
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.conftest import READER, admin_settings, make_client
from tests.admin.sagas import Credit, Noop
from tests.admin.test_insights import TimedTransfer
from tests.admin.test_postgres import pg_store

__all__ = ["pg_store"]  # the fixture, shared with the admin API's Postgres tests


def policy_settings() -> Settings:
    """The admin tests' settings with a flow policy 2 configured (as 1: no limit)."""
    return admin_settings().model_copy(
        update={"limits": LimitsSettings.model_validate({"policies": {"2": {}}})}
    )


async def seed_policies(env: SagaTestEnv) -> dict[str, str]:
    """Two quick transfers on policy 1; then, with policy 2 rolled out to every new
    saga, one refused (compensated) and one past the SLA (waits for approval 3 min)."""
    ids: dict[str, str] = {}

    async def run(label: str, body: dict[str, Any]) -> None:
        ids[label] = await env.engine.start(TimedTransfer, body)
        await env.run_until_settled(SagaRun(env, ids[label], TimedTransfer))

    await run("one-a", {"account": "a", "amount": 1})
    await run("one-b", {"account": "b", "amount": 1})
    await env.set_flow_rollout(2, 100)
    env.participant("payee").on(Credit, reject="account closed", times=1)
    await run("two-refused", {"account": "c", "amount": 1})
    await run("two-slow", {"account": "d", "amount": 1, "wait_for_approval": True})
    await env.advance(timedelta(minutes=3))
    await env.signal(ids["two-slow"], "approve", {"by": "olivia"})
    assert await env.run_until_settled(SagaRun(env, ids["two-slow"], TimedTransfer)) == (
        SagaStatus.COMPLETED
    )
    return ids


async def _get(http: httpx.AsyncClient, path: str, **params: Any) -> dict[str, Any]:
    response = await http.get(path, params={"window": "1d", **params}, headers=READER)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _check_the_split(http: httpx.AsyncClient, ids: dict[str, str]) -> None:
    path = "/saga-types/timed-transfer/insights"
    ran = [{"version": 1, "runs": 2, "share": 0.5}, {"version": 2, "runs": 2, "share": 0.5}]
    every = await _get(http, path)
    assert (every["runs"], every["flow_policy"], every["flow_policies"]) == (4, None, ran)
    assert every["outcomes"] == {"compensated": 1, "completed": 3}
    two = await _get(http, path, flow_policy=2)
    assert (two["runs"], two["flow_policy"], two["flow_policies"]) == (2, 2, ran)
    assert two["outcomes"] == {"compensated": 1, "completed": 1}
    assert (two["sla"]["breached"], two["sla"]["breaching_runs"]) == (1, [ids["two-slow"]])
    one = await _get(http, path, flow_policy=1)
    assert (one["runs"], one["outcomes"]) == (2, {"completed": 2})
    assert (one["sla"]["breached"], one["sla"]["breaching_runs"]) == (0, [])
    credit = {n["name"]: n for n in one["nodes"]}["credit"]
    assert (credit["refusal_rate"], credit["errors"]) == (0.0, [])
    # A policy none of whose runs ended in the window: nothing, the list unchanged.
    none = await _get(http, path, flow_policy=7)
    assert (none["runs"], none["nodes"], none["flow_policies"]) == (0, [], ran)

    compared = await _get(http, f"{path}/policies")
    assert (compared["saga_type"], compared["window"], compared["runs"]) == (
        "timed-transfer",
        "1d",
        4,
    )
    first, second = compared["policies"]
    assert (first["version"], first["runs"], first["share"]) == (1, 2, 0.5)
    assert (first["outcomes"], first["sla_share_within"]) == ({"completed": 2}, 1.0)
    assert (second["version"], second["outcomes"]) == (2, two["outcomes"])
    assert second["duration_ms"] == two["duration_ms"]
    assert [n["name"] for n in first["nodes"]] == ["debit", "credit"]
    assert [n["name"] for n in second["nodes"]] == ["debit", "credit", "signal:approve"]
    debit = second["nodes"][0]
    assert debit["latency_ms"] == {n["name"]: n for n in two["nodes"]}["debit"]["latency_ms"]
    assert debit["held_ms"] is None  # the scripted participants' replies carry no timings


async def _check_bad_values(http: httpx.AsyncClient) -> None:
    path = "/saga-types/timed-transfer/insights"
    for value in ("0", "-1", "two", "1.5", "10001"):
        bad = await http.get(path, params={"flow_policy": value}, headers=READER)
        assert bad.status_code == 422, (value, bad.text)
        assert "flow_policy" in bad.text
    assert (
        await http.get(f"{path}/policies", params={"window": "2h"}, headers=READER)
    ).status_code == 422
    missing = await http.get("/saga-types/nope/insights/policies", headers=READER)
    assert missing.status_code == 404
    assert "nope" in missing.text
    assert (await http.get(f"{path}/policies")).status_code == 401
    # A type with no run: no policy, nothing to compare.
    empty = await _get(http, "/saga-types/noop/insights/policies")
    assert (empty["runs"], empty["policies"]) == (0, [])
    assert (await _get(http, "/saga-types/noop/insights"))["flow_policies"] == []


async def test_insights_by_flow_policy_in_memory() -> None:
    env = SagaTestEnv([TimedTransfer, Noop], settings=policy_settings())
    ids = await seed_policies(env)
    app = create_admin_app(env.engine, env.settings, parts=env.parts)
    async with make_client(app) as http:
        await _check_the_split(http, ids)
        await _check_bad_values(http)


@pytest.mark.integration
async def test_insights_by_flow_policy_on_postgres(pg_store: PostgresEventStore) -> None:
    env = SagaTestEnv([TimedTransfer, Noop], settings=policy_settings(), store=pg_store)
    ids = await seed_policies(env)
    app = create_admin_app(env.engine, env.settings, parts=env.parts)
    async with make_client(app) as http:
        await _check_the_split(http, ids)

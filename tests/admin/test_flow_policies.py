"""Flow policies seen and changed by an operator: ``GET /flow/policies`` (the versions
configured, the rollouts, the audit), ``PUT`` and ``DELETE /flow/policies/rollout``
(audited, refused with the reason), ``GET /flow`` and ``/metrics`` with each gate's
policy and share, and the web page's policy column and rollouts (``saga flow-policy``:
tests/cli/test_flow_policy.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from saga_engine.admin import create_admin_app
from saga_engine.settings import FlowLimit, FlowPolicy, LimitsSettings, Settings
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR, READER, Admin, admin_settings, make_client
from tests.admin.sagas import Debit, Noop, Transfer
from tests.waiting import eventually

LIMITS = LimitsSettings(
    participants={"ledger": FlowLimit(concurrency=1)},
    policies={
        2: FlowPolicy(
            participants={"ledger": FlowLimit(concurrency="adaptive", algorithm="aimd")},
            fairness_weights={"gold": 2},
            learned_costs=False,
        )
    },
)


def with_policies(**admin: Any) -> Settings:
    return admin_settings(**admin).model_copy(update={"limits": LIMITS})


@pytest.fixture
async def policies() -> AsyncIterator[Admin]:
    env = SagaTestEnv([Transfer, Noop], settings=with_policies())
    app = create_admin_app(
        env.engine, env.settings, parts=env.parts, schedules=env.schedules, batches=env.batches
    )
    async with make_client(app) as http:
        yield Admin(env, app, http)


def rollout(version: int, percent: int, reason: str, **more: Any) -> dict[str, Any]:
    return {"version": version, "percent": percent, "reason": reason, **more}


async def test_the_policies_are_listed_with_no_rollout_at_first(policies: Admin) -> None:
    response = await policies.http.get("/flow/policies", headers=READER)
    assert response.status_code == 200, response.text
    view = response.json()
    assert view["versions"] == [1, 2]
    assert set(view["policies"]) == {"1", "2"}
    assert view["policies"]["2"]["learned_costs"] is False
    assert view["policies"]["2"]["participants"]["ledger"]["algorithm"] == "aimd"
    assert (view["rollouts"], view["audit"]) == ([], [])


async def test_set_clear_and_audit_a_flow_rollout(policies: Admin) -> None:
    http = policies.http
    put = await http.put(
        "/flow/policies/rollout", json=rollout(2, 10, "try aimd on a tenth"), headers=OPERATOR
    )
    assert put.status_code == 200, put.text
    (every,) = put.json()["rollouts"]
    assert every == {
        "saga_type": None,
        "rollout": {"version": 2, "percent": 10, "predicate": None},
        "updated_by": "olivia",
        "summary": "10% of new sagas (by saga id) run under flow policy 2; the others under "
        "policy 1",
    }
    typed = await http.put(
        "/flow/policies/rollout",
        json=rollout(2, 100, "all transfers", saga_type="transfer"),
        headers=OPERATOR,
    )
    assert [r["saga_type"] for r in typed.json()["rollouts"]] == [None, "transfer"]
    # The engine serving the API applies them at once (the others at their next refresh).
    assert policies.env.parts.rollouts.get("flow:transfer") is not None
    cleared = await http.delete(
        "/flow/policies/rollout",
        params={"reason": "back to every type's", "saga_type": "transfer"},
        headers=OPERATOR,
    )
    assert cleared.status_code == 200, cleared.text
    assert [r["saga_type"] for r in cleared.json()["rollouts"]] == [None]
    assert policies.env.parts.rollouts.get("flow:transfer") is None
    view = (await http.get("/flow/policies", headers=READER)).json()
    assert [
        (c["saga_type"], c["principal"], c["reason"], c["before"], c["after"])
        for c in view["audit"]
    ] == [
        (
            "flow:transfer",
            "olivia",
            "back to every type's",
            {"version": 2, "percent": 100, "predicate": None},
            None,
        ),
        (
            "flow:transfer",
            "olivia",
            "all transfers",
            None,
            {"version": 2, "percent": 100, "predicate": None},
        ),
        (
            "flow:*",
            "olivia",
            "try aimd on a tenth",
            None,
            {"version": 2, "percent": 10, "predicate": None},
        ),
    ]
    limited = (await http.get("/flow/policies?limit=1", headers=READER)).json()
    assert len(limited["audit"]) == 1
    # The saga versions' rollouts do not list the flow policies' rows.
    assert [v["saga_type"] for v in (await http.get("/rollouts", headers=READER)).json()] == [
        "noop",
        "transfer",
    ]


async def test_bad_or_unauthorised_changes_are_refused_and_write_nothing(
    policies: Admin,
) -> None:
    http = policies.http
    unknown_type = await http.put(
        "/flow/policies/rollout", json=rollout(2, 5, "x", saga_type="nope"), headers=OPERATOR
    )
    assert unknown_type.status_code == 404, unknown_type.text
    assert "no saga named 'nope'" in unknown_type.text
    predicate = await http.put(
        "/flow/policies/rollout", json=rollout(2, 5, "x", predicate="beta"), headers=OPERATOR
    )
    assert predicate.status_code == 422, predicate.text
    assert predicate.json()["detail"][0]["loc"] == ["body", "predicate"]
    assert "declares a rollout predicate 'beta' (declared: none)" in predicate.text
    too_much = await http.put("/flow/policies/rollout", json=rollout(2, 101, "x"), headers=OPERATOR)
    assert too_much.status_code == 422
    assert too_much.json()["detail"][0]["loc"] == ["body", "percent"]
    no_reason = await http.delete("/flow/policies/rollout", headers=OPERATOR)
    assert no_reason.status_code == 422
    reader = await http.put("/flow/policies/rollout", json=rollout(2, 5, "x"), headers=READER)
    assert reader.status_code == 403
    reader = await http.delete("/flow/policies/rollout?reason=x", headers=READER)
    assert reader.status_code == 403
    for method in ("PUT", "DELETE"):
        body = rollout(2, 5, "x") if method == "PUT" else None
        anonymous = await http.request(method, "/flow/policies/rollout?reason=x", json=body)
        assert anonymous.status_code == 401, (method, anonymous.text)
    assert (await http.get("/flow/policies")).status_code == 401
    view = (await http.get("/flow/policies", headers=READER)).json()
    assert (view["rollouts"], view["audit"]) == ([], [])


async def test_each_gate_shows_its_policy_in_the_api_metrics_and_page(policies: Admin) -> None:
    env = policies.env
    env.participant("ledger").on(Debit, no_reply=True)
    http = policies.http
    await http.put(
        "/flow/policies/rollout", json=rollout(2, 100, "x", saga_type="transfer"), headers=OPERATOR
    )
    await policies.start()
    flow = env.parts.flow
    assert flow is not None

    async def body() -> dict[str, Any]:
        found: dict[str, Any] = (await http.get("/flow", headers=READER)).json()
        return found

    shown = await eventually(body, until=lambda b: b["gates"][1]["in_flight"] == 1)
    assert shown["policies"] == [1, 2]
    assert [(g["policy"], g["name"], g["sent"]) for g in shown["gates"]] == [
        (1, "ledger", 0),
        (2, "ledger", 1),
    ]
    assert shown["gates"][1]["adaptive"]["algorithm"] == "aimd"
    # Both policies limit the ledger, and policy 2 took every command: the limit is its.
    assert [g["policy_share"] for g in shown["gates"]] == [0.0, 1.0]
    text = (await http.get("/metrics", headers={**READER, "Accept": "text/plain"})).text
    assert 'saga_flow_in_flight{kind="participant",name="ledger",policy="2"} 1' in text
    assert 'saga_flow_in_flight{kind="participant",name="ledger",policy="1"} 0' in text
    assert 'saga_flow_policy_share{kind="participant",name="ledger",policy="2"}' in text
    page = (await http.get("/ui/sagas", headers=READER)).text
    assert "<th>Policy</th>" in page
    assert 'data-policy="2"' in page
    assert "Flow policies configured: 1, 2." in page
    assert "100% of new sagas (by saga id) run under flow policy 2" in page


async def test_with_one_policy_the_page_has_no_policy_column() -> None:
    settings = admin_settings().model_copy(
        update={"limits": LimitsSettings(participants={"ledger": FlowLimit(concurrency=1)})}
    )
    env = SagaTestEnv([Transfer, Noop], settings=settings)
    app = create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    async with make_client(app) as http:
        page = (await http.get("/ui/sagas", headers=READER)).text
        body = (await http.get("/flow", headers=READER)).json()
    assert 'class="flow"' in page
    assert "<th>Policy</th>" not in page
    assert "Flow policies configured" not in page
    assert body["policies"] == [1]

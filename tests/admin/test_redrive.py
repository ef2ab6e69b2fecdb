"""Issue 26 §3 and §6 through the admin API: a parked step retried with an edited
command (or refused one), a rerun linked to its original, a cancel past the pivot."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from saga_engine import SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.replay import load_history
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.conftest import OPERATOR, READER, admin_settings, make_client
from tests.admin.redrive_sagas import Order, Ship


class Api:
    def __init__(self, env: SagaTestEnv, http: httpx.AsyncClient) -> None:
        self.env, self.http = env, http

    async def parked(self, pivot: bool = False, order: str = "o-1") -> str:
        """An order whose ``ship`` step was refused and parked (after ``charge``)."""
        self.env.participant("shipping").on(Ship, reject="no such address", times=1)
        body = {"order": order, "amount": 5, "pivot": pivot}
        answer = await self.http.post("/sagas/order", json=body, headers=OPERATOR)
        assert answer.status_code == 202, answer.text
        saga_id: str = answer.json()["saga_id"]
        assert await self.settle(saga_id) == SagaStatus.STEP_STUCK
        return saga_id

    async def settle(self, saga_id: str) -> SagaStatus:
        return await self.env.run_until_settled(SagaRun(self.env, saga_id, Order))

    async def detail(self, saga_id: str) -> dict[str, object]:
        answer = await self.http.get(f"/sagas/{saga_id}", headers=READER)
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    env = SagaTestEnv([Order], settings=admin_settings())
    for participant in ("stock", "payments"):
        env.participant(participant)
    env.participant("shipping").on(Ship, reply={"to": "42 Main St"})
    app = create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    async with make_client(app) as http:
        yield Api(env, http)


async def test_a_parked_step_is_retried_with_an_edited_command(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    saga_id = await api.parked()
    detail = await api.detail(saga_id)
    assert detail["parked_steps"] == ["ship"]
    assert [w["kind"] for w in detail["waiting_for"]] == ["operator"]  # type: ignore[attr-defined]
    # The command model refuses it: a 422 naming the field, nothing recorded.
    bad = await api.http.post(
        f"/sagas/{saga_id}/retry",
        json={"step": "ship", "reason": "fixed", "command": {"order": "o-1", "address": "x"}},
        headers=OPERATOR,
    )
    assert bad.status_code == 422, bad.text
    assert "address" in bad.text
    # An edited command for a step that is not parked: a 409.
    conflict = await api.http.post(
        f"/sagas/{saga_id}/retry",
        json={"step": "charge", "reason": "x", "command": {"order": "o-1", "amount": 1}},
        headers=OPERATOR,
    )
    assert conflict.status_code == 409, conflict.text
    assert (await api.detail(saga_id))["events"] == detail["events"]
    caplog.set_level(logging.INFO, "saga_engine.admin.audit")
    edited = {"order": "o-1", "address": "42 Main St"}
    ok = await api.http.post(
        f"/sagas/{saga_id}/retry",
        json={"step": "ship", "reason": "address fixed", "command": edited},
        headers=OPERATOR,
    )
    assert ok.status_code == 200, ok.text
    assert await api.settle(saga_id) == SagaStatus.COMPLETED
    assert api.env.commands("shipping")[-1].payload == edited
    history = load_history(
        (await api.http.get(f"/sagas/{saga_id}/history", headers=READER)).content
    )
    retry = next(e for e in history.events if e.kind == "retry_requested")
    assert (retry.principal, retry.reason, retry.command) == ("olivia", "address fixed", edited)
    ships = [e for e in history.events if e.kind == "command_issued" and e.step == "ship"]
    assert [e.payload["address"] for e in ships] == ["nowhere", "42 Main St"]
    assert f"retry step 'ship' with an edited command of saga {saga_id} by olivia" in caplog.text


async def test_past_its_pivot_a_cancel_is_a_409_and_the_view_says_so(api: Api) -> None:
    saga_id = await api.parked(pivot=True)
    detail = await api.detail(saga_id)
    assert (detail["pivot_step"], detail["past_pivot"]) == ("charge", True)
    refused = await api.http.post(
        f"/sagas/{saga_id}/cancel", json={"reason": "customer asked"}, headers=OPERATOR
    )
    assert refused.status_code == 409, refused.text
    assert "past its pivot" in refused.text
    assert (await api.detail(saga_id))["status"] == "step_stuck"
    page = await api.http.get(f"/ui/sagas/{saga_id}", headers=READER)
    assert page.status_code == 200
    assert 'id="pivot">pivot step <strong>charge</strong>: passed' in page.text
    assert "step_parked" in page.text  # the timeline's history


async def test_rerun_starts_a_linked_saga_once_per_request(api: Api) -> None:
    original = await api.parked(order="o-9")
    bad = await api.http.post(
        f"/sagas/{original}/rerun",
        json={"reason": "again", "input": {"order": "o-9"}},
        headers=OPERATOR,
    )
    assert bad.status_code == 422, bad.text
    assert "amount" in bad.text
    body = {"reason": "retry with a new amount", "input": {"order": "o-9", "amount": 7}}
    first = await api.http.post(f"/sagas/{original}/rerun", json=body, headers=OPERATOR)
    assert first.status_code == 202, first.text
    again = await api.http.post(f"/sagas/{original}/rerun", json=body, headers=OPERATOR)
    assert again.status_code == 202, again.text
    assert again.json()["saga_id"] == first.json()["saga_id"] != original
    assert again.headers.get("Idempotent-Replayed") == "true"
    rerun_id = first.json()["saga_id"]
    assert await api.settle(rerun_id) == SagaStatus.COMPLETED
    detail = await api.detail(rerun_id)
    assert detail["rerun_of"] == {
        "saga_id": original,
        "principal": "olivia",
        "reason": "retry with a new amount",
    }
    assert detail["input"] == {"order": "o-9", "amount": 7, "pivot": False}
    assert (await api.detail(original))["reruns"] == [{"saga_id": rerun_id, "status": "completed"}]
    original_page = await api.http.get(f"/ui/sagas/{original}", headers=READER)
    assert f'id="reruns">re-run as <a href="/ui/sagas/{rerun_id}"' in original_page.text
    page = await api.http.get(f"/ui/sagas/{rerun_id}", headers=READER)
    assert f'id="rerun-of">a rerun of <a href="/ui/sagas/{original}"' in page.text
    reader = await api.http.post(f"/sagas/{original}/rerun", json=body, headers=READER)
    assert reader.status_code == 403


async def test_rerun_refuses_an_unknown_saga_and_a_reused_key(api: Api) -> None:
    missing = await api.http.post(
        "/sagas/no-such-saga/rerun", json={"reason": "x"}, headers=OPERATOR
    )
    assert missing.status_code == 404, missing.text
    original = await api.parked(order="o-7")
    keyed = {"reason": "again", "idempotency_key": "rerun-o-7"}
    first = await api.http.post(f"/sagas/{original}/rerun", json=keyed, headers=OPERATOR)
    assert first.status_code == 202, first.text
    other_input = {**keyed, "input": {"order": "o-7", "amount": 99}}
    conflict = await api.http.post(f"/sagas/{original}/rerun", json=other_input, headers=OPERATOR)
    assert conflict.status_code == 409, conflict.text
    assert first.json()["saga_id"] in conflict.text

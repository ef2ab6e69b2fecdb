"""The retry, skip and force-compensate operator actions of the admin API."""

from __future__ import annotations

import logging

import pytest

from saga_engine import SagaStatus
from saga_engine.events import event_to_dict
from saga_engine.replay import load_history
from tests.admin.conftest import OPERATOR, READER, Admin
from tests.admin.sagas import Credit, Refund
from tests.admin.test_api import stuck_saga, waiting_saga


async def _events(admin: Admin, saga_id: str, kind: str) -> list[dict[str, object]]:
    history = load_history(
        (await admin.http.get(f"/sagas/{saga_id}/history", headers=READER)).content
    )
    return [event_to_dict(e) for e in history.events if e.kind == kind]


async def test_retry_retries_a_stuck_compensation(
    admin: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    saga_id = await stuck_saga(admin)
    caplog.set_level(logging.INFO, "saga_engine.admin.audit")
    response = await admin.http.post(
        f"/sagas/{saga_id}/retry",
        json={"step": "debit", "reason": "ledger unlocked"},
        headers=OPERATOR,
    )
    assert response.status_code == 200, response.text
    assert response.json()["action"] == "retry"
    assert response.json()["principal"] == "olivia"
    assert await admin.settle(saga_id) == SagaStatus.COMPENSATED
    [event] = await _events(admin, saga_id, "retry_requested")
    assert (event["principal"], event["reason"], event["step"]) == (
        "olivia",
        "ledger unlocked",
        "debit",
    )
    assert f"retry step 'debit' of saga {saga_id} by olivia: 'ledger unlocked'" in caplog.text


async def test_skip_answers_a_step_with_the_given_result(admin: Admin) -> None:
    saga_id = await admin.start()  # the debit command awaits its reply
    response = await admin.http.post(
        f"/sagas/{saga_id}/skip",
        json={"step": "debit", "result": {"done": "by hand"}, "reason": "booked manually"},
        headers=OPERATOR,
    )
    assert response.status_code == 200, response.text
    assert response.json()["action"] == "skip"
    assert await admin.settle(saga_id) == SagaStatus.COMPLETED
    [event] = await _events(admin, saga_id, "step_skipped")
    assert (event["principal"], event["reason"], event["step"]) == (
        "olivia",
        "booked manually",
        "debit",
    )


async def test_force_compensate_undoes_a_running_saga(admin: Admin) -> None:
    saga_id = await waiting_saga(admin)
    response = await admin.http.post(
        f"/sagas/{saga_id}/force-compensate", json={"reason": "fraud"}, headers=OPERATOR
    )
    assert response.status_code == 200, response.text
    assert response.json()["action"] == "force-compensate"
    assert await admin.settle(saga_id) == SagaStatus.COMPENSATED
    assert admin.env.compensated_steps() == ["credit", "debit"]


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("retry", {"step": "debit", "reason": "late"}),
        ("skip", {"step": "debit", "result": {}, "reason": "late"}),
        ("force-compensate", {"reason": "late"}),
    ],
)
async def test_actions_on_a_completed_saga_get_409(
    admin: Admin, action: str, body: dict[str, object]
) -> None:
    done = await admin.start()
    assert await admin.settle(done) == SagaStatus.COMPLETED
    response = await admin.http.post(f"/sagas/{done}/{action}", json=body, headers=OPERATOR)
    assert response.status_code == 409, response.text
    assert response.json()["error"] == "InvalidTransition"
    assert f"saga {done} is completed" in response.json()["detail"]


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("retry", {"step": "debit", "reason": "r"}),
        ("skip", {"step": "debit", "result": {}, "reason": "r"}),
        ("force-compensate", {"reason": "r"}),
    ],
)
async def test_actions_on_unknown_sagas_are_404(
    admin: Admin, action: str, body: dict[str, object]
) -> None:
    response = await admin.http.post(f"/sagas/missing/{action}", json=body, headers=OPERATOR)
    assert response.status_code == 404, response.text


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("retry", {"reason": "r"}),
        ("retry", {"step": "debit", "reason": " "}),
        ("skip", {"step": "debit", "reason": "r"}),
        ("skip", {"step": "debit", "result": [], "reason": "r"}),
        ("force-compensate", {}),
        ("force-compensate", {"reason": "r", "step": "x"}),
    ],
)
async def test_actions_validate_their_body(
    admin: Admin, action: str, body: dict[str, object]
) -> None:
    saga_id = await waiting_saga(admin)
    response = await admin.http.post(f"/sagas/{saga_id}/{action}", json=body, headers=OPERATOR)
    assert response.status_code == 422, response.text


async def test_a_signal_to_a_parked_saga_is_refused_naming_its_state(admin: Admin) -> None:
    """A saga parked with its compensation stuck runs no code that could take a signal:
    before, the signal was recorded (200) and never consumed."""
    admin.env.participant("payee").on(Credit, reject="closed", times=1)
    admin.env.participant("ledger").on(Refund, reject="locked", times=2)
    saga_id = await admin.start()
    assert await admin.settle(saga_id) == SagaStatus.COMPENSATION_STUCK
    response = await admin.http.post(
        f"/sagas/{saga_id}/signal",
        json={"name": "approve", "payload": {"by": "x"}},
        headers=OPERATOR,
    )
    assert response.status_code == 409, response.text
    assert "is compensation_stuck" in response.json()["detail"]
    history = (await admin.http.get(f"/sagas/{saga_id}/history", headers=OPERATOR)).json()
    assert "signal_received" not in [e["kind"] for e in history["events"]]

"""An operator's action answers what happened (issue 39, 8.4): accepted once it is
recorded, even when the commands it decided could not be sent yet (they are owed from
history and sent when the broker takes them); refused with the reason; and "unknown"
only when the outcome cannot be read."""

from __future__ import annotations

from typing import Any

import pytest

from saga_engine import KafkaUnavailable, OutboundCommand, SagaStatus, TransientError
from tests.admin.conftest import OPERATOR, Admin
from tests.admin.test_api import waiting_saga


def _compensation(command: OutboundCommand) -> bool:
    return command.compensation


async def test_a_cancel_recorded_whose_first_send_failed_is_accepted(admin: Admin) -> None:
    saga_id = await waiting_saga(admin)
    admin.env.bus.fail(_compensation)  # the broker does not take the first undo
    response = await admin.http.post(
        f"/sagas/{saga_id}/cancel", json={"reason": "customer called"}, headers=OPERATOR
    )
    assert response.status_code == 200, response.text  # was a 503 "not acknowledged"
    assert response.json()["outcome"] == "accepted"
    history = await admin.env.engine.history(saga_id)
    assert "cancel_requested" in [e.kind for e in history]
    await admin.env.engine.recover()  # whoever loads it next sends what it owes
    assert await admin.settle(saga_id) == SagaStatus.CANCELLED
    assert admin.env.compensated_steps() == ["credit", "debit"]


async def test_an_action_recorded_before_a_transient_failure_is_accepted_with_a_note(
    admin: Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    saga_id = await waiting_saga(admin)
    engine = admin.env.engine
    cancel = engine.cancel

    async def recorded_then_lost(*args: Any, **kwargs: Any) -> Any:
        await cancel(*args, **kwargs)
        raise KafkaUnavailable("the broker did not acknowledge (test)")

    monkeypatch.setattr(engine, "cancel", recorded_then_lost)
    response = await admin.http.post(
        f"/sagas/{saga_id}/cancel", json={"reason": "r"}, headers=OPERATOR
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["outcome"] == "accepted"
    assert "owed from the saga's history" in answer["note"]
    assert "the broker did not acknowledge" in answer["note"]


async def test_a_refused_action_says_why(admin: Admin) -> None:
    done = await admin.start()
    await admin.settle(done)
    response = await admin.http.post(
        f"/sagas/{done}/cancel", json={"reason": "late"}, headers=OPERATOR
    )
    assert response.status_code == 409
    assert response.json()["error"] == "InvalidTransition"
    assert "completed" in response.json()["detail"]


async def test_an_action_applied_at_once_is_accepted(admin: Admin) -> None:
    saga_id = await waiting_saga(admin)
    response = await admin.http.post(
        f"/sagas/{saga_id}/cancel", json={"reason": "r"}, headers=OPERATOR
    )
    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "accepted"
    assert response.json()["note"] is None


async def test_a_failure_before_anything_is_recorded_says_send_it_again(
    admin: Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    saga_id = await waiting_saga(admin)

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise TransientError("postgres is away (test)")

    monkeypatch.setattr(admin.env.engine, "cancel", down)
    response = await admin.http.post(
        f"/sagas/{saga_id}/cancel", json={"reason": "r"}, headers=OPERATOR
    )
    assert response.status_code == 503
    assert response.json()["error"] == "TransientError"
    assert "not recorded" in response.json()["detail"]
    assert "send it again" in response.json()["detail"]


async def test_an_outcome_that_cannot_be_read_is_unknown(
    admin: Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    saga_id = await waiting_saga(admin)

    async def down(*args: Any, **kwargs: Any) -> Any:
        raise TransientError("postgres is away (test)")

    monkeypatch.setattr(admin.env.engine, "cancel", down)
    monkeypatch.setattr(admin.env.engine, "history", down)
    response = await admin.http.post(
        f"/sagas/{saga_id}/cancel", json={"reason": "r"}, headers=OPERATOR
    )
    assert response.status_code == 503
    assert response.json()["error"] == "OutcomeUnknown"
    assert f"saga history {saga_id}" in response.json()["detail"]

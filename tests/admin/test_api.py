"""Every endpoint's happy path and its refusals, on the in-memory engine."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

from saga_engine import SagaStatus, TransientError
from saga_engine.admin import create_admin_app
from saga_engine.events import event_to_dict
from saga_engine.replay import load_history, replay
from tests.admin.conftest import OPERATOR, READER, Admin, make_client
from tests.admin.sagas import Credit, Noop, Refund, Transfer


async def stuck_saga(admin: Admin) -> str:
    """A transfer whose credit is refused and whose debit's refund keeps failing."""
    admin.env.participant("payee").on(Credit, reject="account closed")
    admin.env.participant("ledger").on(Refund, reject="ledger locked", times=2)
    saga_id = await admin.start()
    assert await admin.settle(saga_id) == SagaStatus.COMPENSATION_STUCK
    return saga_id


async def waiting_saga(admin: Admin) -> str:
    """A transfer with both steps applied, waiting for its approval signal."""
    saga_id = await admin.start(wait_for_approval=True)
    assert await admin.settle(saga_id) == SagaStatus.RUNNING
    return saga_id


# --------------------------------------------------------------------------- start and read


async def test_start_then_read_the_saga_and_its_history(admin: Admin) -> None:
    response = await admin.http.post(
        "/sagas/transfer", json={"account": "acc-1", "amount": 25}, headers=OPERATOR
    )
    assert response.status_code == 202
    started = response.json()
    saga_id = started["saga_id"]
    assert started["status_url"] == f"/sagas/{saga_id}"
    assert started["status"] == "running"
    assert await admin.settle(saga_id) == SagaStatus.COMPLETED

    got = await admin.http.get(started["status_url"], headers=READER)
    assert got.status_code == 200
    body = got.json()
    assert body["saga_id"] == saga_id
    assert body["saga_type"] == "transfer"
    assert body["status"] == "completed"
    assert body["input"] == {"account": "acc-1", "amount": 25, "wait_for_approval": False}
    assert body["output"] == {"ok": True, "approved_by": ""}
    assert body["error"] is None
    assert body["pending_compensations"] == []
    assert body["events"] > 3

    history = await admin.http.get(f"/sagas/{saga_id}/history", headers=READER)
    assert history.status_code == 200
    assert "content-disposition" not in history.headers
    exported = load_history(history.content)
    assert exported.saga_id == saga_id
    assert exported.events[0].kind == "saga_started"
    assert exported.events[-1].kind == "saga_completed"
    assert replay([Transfer], exported).deterministic

    download = await admin.http.get(f"/sagas/{saga_id}/history?download=1", headers=READER)
    assert download.headers["content-disposition"] == (
        f'attachment; filename="saga-{saga_id}.history.json"'
    )
    assert load_history(download.content).events == exported.events


async def test_an_idempotency_key_starts_one_saga(admin: Admin) -> None:
    headers = {**OPERATOR, "Idempotency-Key": "order-42"}
    first = await admin.http.post(
        "/sagas/transfer", json={"account": "a", "amount": 1}, headers=headers
    )
    again = await admin.http.post(
        "/sagas/transfer", json={"account": "a", "amount": 1}, headers=headers
    )
    other = await admin.http.post(
        "/sagas/transfer",
        json={"account": "a", "amount": 1},
        headers={**OPERATOR, "Idempotency-Key": "order-43"},
    )
    assert first.status_code == again.status_code == other.status_code == 202
    assert first.json()["saga_id"] == again.json()["saga_id"] != other.json()["saga_id"]
    listed = (await admin.http.get("/sagas", headers=READER)).json()["items"]
    assert len(listed) == 2
    detail = (await admin.http.get(f"/sagas/{first.json()['saga_id']}", headers=READER)).json()
    assert detail["idempotency_key"] == "order-42"


async def test_start_uses_the_given_starter(admin: Admin) -> None:
    calls: list[tuple[str, dict[str, Any], str | None]] = []

    async def through_inbox(
        saga_type: str, payload: dict[str, Any], *, idempotency_key: str | None
    ) -> str:
        calls.append((saga_type, payload, idempotency_key))
        return "queued-1"

    app = create_admin_app(
        admin.env.engine,
        admin.env.settings,
        start_saga=through_inbox,
        parts=admin.env.parts,
        schedules=admin.env.schedules,
    )
    async with make_client(app) as http:
        response = await http.post(
            "/sagas/transfer",
            json={"account": "a", "amount": 3},
            headers={**OPERATOR, "Idempotency-Key": "k-1"},
        )
        assert response.status_code == 202
        assert response.json() == {
            "saga_id": "queued-1",
            "status_url": "/sagas/queued-1",
            "status": None,
        }
        # Not created yet (the inbox has not delivered it): waiting gives up cleanly.
        waited = await http.post(
            "/sagas/transfer?wait=0.2", json={"account": "a", "amount": 3}, headers=OPERATOR
        )
        assert waited.status_code == 202
    # The body goes on as it came (the engine fills in the defaults once).
    assert calls[0] == ("transfer", {"account": "a", "amount": 3}, "k-1")


async def test_start_and_wait_returns_the_settled_saga(admin: Admin) -> None:
    async def participants() -> None:
        while True:
            await admin.env.settle()
            await asyncio.sleep(0.005)

    pump = asyncio.create_task(participants())
    try:
        done = await admin.http.post(
            "/sagas/transfer?wait=10", json={"account": "a", "amount": 5}, headers=OPERATOR
        )
        assert done.status_code == 200, done.text
        assert done.json()["status"] == "completed"
        assert done.json()["output"] == {"ok": True, "approved_by": ""}

        pending = await admin.http.post(
            "/sagas/transfer?wait=0.3",
            json={"account": "a", "amount": 5, "wait_for_approval": True},
            headers=OPERATOR,
        )
        assert pending.status_code == 202
        assert pending.json()["status"] == "running"
    finally:
        pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)


@pytest.mark.parametrize(
    ("content", "headers", "status", "says"),
    [
        (b'{"account": "a", "amount": -1}', {}, 422, "greater than 0"),
        (b'{"account": "a"}', {}, 422, "Field required"),
        (b'{"account": "a", "amount": ', {}, 400, "malformed JSON"),
        (b"[1, 2]", {}, 422, "JSON object"),
        (b"", {}, 422, "JSON object"),
        (
            b"account=a",
            {"Content-Type": "application/x-www-form-urlencoded"},
            415,
            "application/json",
        ),
    ],
)
async def test_start_rejects_bad_input(
    admin: Admin, content: bytes, headers: dict[str, str], status: int, says: str
) -> None:
    response = await admin.http.post(
        "/sagas/transfer",
        content=content,
        headers={"Content-Type": "application/json", **headers, **OPERATOR},
    )
    assert response.status_code == status, response.text
    assert says in response.text
    assert (await admin.http.get("/sagas", headers=READER)).json()["items"] == []


async def test_invalid_input_reports_pydantic_errors(admin: Admin) -> None:
    response = await admin.http.post(
        "/sagas/transfer", json={"account": "", "amount": "lots"}, headers=OPERATOR
    )
    assert response.status_code == 422
    errors = response.json()["detail"]
    assert {tuple(e["loc"]) for e in errors} == {("body", "account"), ("body", "amount")}
    assert all("msg" in e and "type" in e for e in errors)


async def test_unknown_saga_type_is_404(admin: Admin) -> None:
    response = await admin.http.post("/sagas/nope", json={}, headers=OPERATOR)
    assert response.status_code == 404
    assert response.json() == {
        "detail": "no saga named 'nope' is registered (known: noop, transfer)",
        "error": "UnknownSagaType",
    }


async def test_oversized_bodies_get_413_before_being_read(admin: Admin) -> None:
    limit = admin.env.settings.admin.max_body_bytes
    big = b'{"account": "' + b"x" * limit + b'", "amount": 1}'
    declared = await admin.http.post(
        "/sagas/transfer", content=big, headers={**OPERATOR, "Content-Type": "application/json"}
    )
    assert declared.status_code == 413
    assert f"limit of {limit} bytes" in declared.json()["detail"]

    async def chunks() -> Any:  # no Content-Length: counted as it streams
        yield big[: limit // 2]
        yield big[limit // 2 :]

    streamed = await admin.http.post(
        "/sagas/transfer",
        content=chunks(),
        headers={**OPERATOR, "Content-Type": "application/json"},
    )
    assert streamed.status_code == 413
    signal = await admin.http.post(
        "/sagas/any/signal",
        content=chunks(),
        headers={**OPERATOR, "Content-Type": "application/json"},
    )
    assert signal.status_code == 413
    assert (await admin.http.get("/sagas", headers=READER)).json()["items"] == []


# --------------------------------------------------------------------------- detail


async def test_detail_lists_owed_compensations_newest_first(admin: Admin) -> None:
    saga_id = await waiting_saga(admin)
    body = (await admin.http.get(f"/sagas/{saga_id}", headers=READER)).json()
    assert body["status"] == "running"
    assert [(p["step"], p["state"]) for p in body["pending_compensations"]] == [
        ("credit", "owed"),
        ("debit", "owed"),
    ]
    assert body["pending_compensations"][1] == {
        "step": "debit",
        "participant": "ledger",
        "command_type": "Refund",
        "payload": {"account": "acc-1", "amount": 10},
        "state": "owed",
        "attempts": 0,
        "last_error": None,
    }


async def test_detail_of_a_step_in_flight_is_in_doubt(admin: Admin) -> None:
    saga_id = await admin.start()  # not settled: the debit command awaits its reply
    body = (await admin.http.get(f"/sagas/{saga_id}", headers=READER)).json()
    assert body["current_step"] == "debit"
    assert [(p["step"], p["state"]) for p in body["pending_compensations"]] == [
        ("debit", "in_doubt")
    ]


async def test_detail_of_a_stuck_saga(admin: Admin) -> None:
    saga_id = await stuck_saga(admin)
    body = (await admin.http.get(f"/sagas/{saga_id}", headers=READER)).json()
    assert body["status"] == "compensation_stuck"
    [pending] = body["pending_compensations"]
    assert pending["step"] == "debit"
    assert pending["state"] == "stuck"
    assert pending["attempts"] == 2
    assert "ledger locked" in pending["last_error"]
    assert body["error"] is not None


async def test_unknown_sagas_are_404(admin: Admin) -> None:
    for method, path, body in [
        ("GET", "/sagas/missing", None),
        ("GET", "/sagas/missing/history", None),
        ("GET", f"/sagas/{'x' * 300}", None),
        ("POST", "/sagas/missing/signal", {"name": "approve"}),
        ("POST", "/sagas/missing/cancel", {"reason": "r"}),
        ("POST", "/sagas/missing/resume", {"reason": "r"}),
    ]:
        response = await admin.http.request(method, path, json=body, headers=OPERATOR)
        assert response.status_code == 404, (path, response.text)
        assert response.json()["error"] == "SagaNotFound"
    # An id no saga can have (a NUL in it) is a malformed request, naming the field.
    response = await admin.http.get("/sagas/nul%00id", headers=OPERATOR)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["path", "saga"]


async def test_wrong_methods_are_405(admin: Admin) -> None:
    assert (await admin.http.delete("/sagas/x", headers=OPERATOR)).status_code == 405
    assert (await admin.http.get("/sagas/x/cancel", headers=OPERATOR)).status_code == 405
    assert (await admin.http.put("/metrics", headers=OPERATOR)).status_code == 405
    assert (await admin.http.get("/nowhere", headers=OPERATOR)).status_code == 404


# --------------------------------------------------------------------------- listing


async def test_list_filters_by_status_type_and_id(admin: Admin) -> None:
    done = await admin.start()
    await admin.settle(done)
    waiting = await waiting_saga(admin)
    stuck = await stuck_saga(admin)
    noop = await admin.env.engine.start(Noop, {})

    async def ids(query: str) -> set[str]:
        response = await admin.http.get(f"/sagas?{query}", headers=READER)
        assert response.status_code == 200, response.text
        return {i["saga_id"] for i in response.json()["items"]}

    assert await ids("") == {done, waiting, stuck, noop}
    assert await ids("status=completed") == {done, noop}
    assert await ids("status=running&status=compensation_stuck") == {waiting, stuck}
    assert await ids("type=transfer&status=completed") == {done}
    assert await ids("type=noop") == {noop}
    assert await ids("type=unknown") == set()
    assert await ids(f"q={stuck[:8]}") == {stuck}  # the first characters of an id
    assert await ids(f"q={stuck[:8]}&status=completed") == set()
    assert await ids(f"q={stuck[3:11]}") == set()  # a prefix, not a substring
    [item] = (await admin.http.get(f"/sagas?q={waiting}", headers=READER)).json()["items"]
    assert item["saga_type"] == "transfer"
    assert item["status"] == "running"
    assert item["created_at"] <= item["updated_at"]


async def test_list_filters_by_time_range(admin: Admin) -> None:
    env = admin.env
    t0 = env.now()
    first = await admin.start()
    await admin.settle(first)  # created and finished at t0
    await env.advance(timedelta(hours=1))
    second = await admin.start(wait_for_approval=True)  # created at t0 + 1h
    await admin.settle(second)
    await env.advance(timedelta(hours=1))
    await env.signal(second, "approve", {"by": "olivia"})  # updated at t0 + 2h
    assert await admin.settle(second) == SagaStatus.COMPLETED

    def at(minutes: int, *, naive: bool = False) -> str:
        moment = t0 + timedelta(minutes=minutes)
        return moment.replace(tzinfo=None).isoformat() if naive else moment.isoformat()

    async def ids(**query: str) -> list[str]:
        response = await admin.http.get("/sagas", params=query, headers=READER)
        assert response.status_code == 200, response.text
        return [i["saga_id"] for i in response.json()["items"]]

    assert await ids(created_after=at(30)) == [second]
    assert await ids(created_before=at(30, naive=True)) == [first]  # naive: UTC
    assert sorted(await ids(created_after=at(0), created_before=at(61))) == sorted([first, second])
    assert await ids(created_after=at(60), created_before=at(61)) == [second]  # inclusive
    assert await ids(created_after=at(0), created_before=at(60)) == [first]  # exclusive
    assert await ids(updated_after=at(90)) == [second]
    assert await ids(updated_before=at(90)) == [first]
    assert await ids(updated_before=at(0)) == []
    assert await ids(updated_after=at(90), status="running") == []


async def test_list_pages_with_a_cursor(admin: Admin) -> None:
    ids = sorted([await admin.env.engine.start(Noop, {}) for _ in range(7)])
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {
            "limit": 3,
            "sort": "id",
            **({"cursor": cursor} if cursor else {}),
        }
        page = (await admin.http.get("/sagas", params=params, headers=READER)).json()
        seen += [i["saga_id"] for i in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    assert pages == 3


async def test_the_search_finds_by_id_prefix_or_idempotency_key_and_pages_exactly(
    admin: Admin,
) -> None:
    ids = sorted([await admin.env.engine.start(Noop, {}) for _ in range(120)])
    keyed = await admin.env.engine.start(Noop, {}, idempotency_key="order-4711")
    target = ids[-1]

    async def pages(**query: Any) -> tuple[list[str], int]:
        found: list[str] = []
        requests = 0
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {
                "sort": "id",
                **query,
                **({"cursor": cursor} if cursor else {}),
            }
            page = (await admin.http.get("/sagas", params=params, headers=READER)).json()
            requests += 1
            found += [i["saga_id"] for i in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                return found, requests

    # Answered by the store's query: one request, however far the match is.
    assert await pages(q=target[:10]) == ([target], 1)
    assert await pages(q="order-4711") == ([keyed], 1)
    assert await pages(q="order-47") == ([], 1)  # a key matches whole
    # Time filters page exactly: full pages, then the rest, each saga once.
    listed, requests = await pages(created_after="2000-01-01T00:00:00Z", limit=40)
    assert listed == sorted([*ids, keyed])
    assert requests == 4


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ("status=exploded", 422),
        ("limit=0", 422),
        ("limit=501", 422),
        ("limit=ten", 422),
        ("created_after=yesterday", 422),
        ("created_after=2030-01-02T00:00:00Z&created_before=2030-01-01T00:00:00Z", 422),
        ("updated_after=2030-01-02T00:00:00Z&updated_before=2030-01-02T00:00:00Z", 422),
        ("cursor=not-a-cursor", 400),
        ("cursor=eyJ2IjoyfQ", 400),
        ("q=", 422),
        ("q=a%00b", 422),
        ("type=a%00b", 422),
    ],
)
async def test_list_rejects_bad_filters(admin: Admin, query: str, status: int) -> None:
    response = await admin.http.get(f"/sagas?{query}", headers=READER)
    assert response.status_code == status, response.text
    assert response.json()["detail"]


# --------------------------------------------------------------------------- operator actions


async def test_signal_is_delivered_once(admin: Admin) -> None:
    saga_id = await waiting_saga(admin)
    body = {"name": "approve", "payload": {"by": "olivia"}, "signal_id": "s-1", "reason": "ok'd"}
    response = await admin.http.post(f"/sagas/{saga_id}/signal", json=body, headers=OPERATOR)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "saga_id": saga_id,
        "action": "signal",
        "principal": "olivia",
        "status": "completed",
        "signal_id": "s-1",
        "dropped": None,
        "outcome": "accepted",
        "note": None,
    }
    assert await admin.settle(saga_id) == SagaStatus.COMPLETED
    detail = (await admin.http.get(f"/sagas/{saga_id}", headers=READER)).json()
    assert detail["output"] == {"ok": True, "approved_by": "olivia"}
    history = load_history(
        (await admin.http.get(f"/sagas/{saga_id}/history", headers=READER)).content
    )
    [received] = [e for e in history.events if e.kind == "signal_received"]
    assert {k: event_to_dict(received)[k] for k in ("principal", "reason")} == {
        "principal": "olivia",
        "reason": "ok'd",
    }
    again = await admin.http.post(f"/sagas/{saga_id}/signal", json=body, headers=OPERATOR)
    assert again.status_code == 409  # the saga is completed now
    assert "completed" in again.json()["detail"]


async def test_a_repeated_signal_id_is_dropped(admin: Admin) -> None:
    saga_id = await waiting_saga(admin)
    body = {"name": "other", "signal_id": "s-9"}
    first = await admin.http.post(f"/sagas/{saga_id}/signal", json=body, headers=OPERATOR)
    second = await admin.http.post(f"/sagas/{saga_id}/signal", json=body, headers=OPERATOR)
    assert first.json()["dropped"] is None
    assert second.json()["dropped"] == "duplicate_signal"
    generated = await admin.http.post(
        f"/sagas/{saga_id}/signal", json={"name": "other"}, headers=OPERATOR
    )
    assert generated.json()["signal_id"]


async def test_cancel_compensates_and_is_audited(
    admin: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    saga_id = await waiting_saga(admin)
    caplog.set_level(logging.INFO, "saga_engine.admin.audit")
    response = await admin.http.post(
        f"/sagas/{saga_id}/cancel", json={"reason": "customer called"}, headers=OPERATOR
    )
    assert response.status_code == 200, response.text
    assert response.json()["principal"] == "olivia"
    assert response.json()["action"] == "cancel"
    assert await admin.settle(saga_id) == SagaStatus.CANCELLED
    assert admin.env.compensated_steps() == ["credit", "debit"]
    history = load_history(
        (await admin.http.get(f"/sagas/{saga_id}/history", headers=READER)).content
    )
    [requested] = [e for e in history.events if e.kind == "cancel_requested"]
    assert {k: event_to_dict(requested)[k] for k in ("principal", "reason")} == {
        "principal": "olivia",
        "reason": "customer called",
    }
    assert f"cancel saga {saga_id} by olivia: 'customer called'" in caplog.text


async def test_resume_retries_a_stuck_compensation(admin: Admin) -> None:
    saga_id = await stuck_saga(admin)
    response = await admin.http.post(
        f"/sagas/{saga_id}/resume", json={"reason": "ledger unlocked"}, headers=OPERATOR
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "compensating"
    assert await admin.settle(saga_id) == SagaStatus.COMPENSATED
    history = load_history(
        (await admin.http.get(f"/sagas/{saga_id}/history", headers=READER)).content
    )
    [resumed] = [e for e in history.events if e.kind == "saga_resumed"]
    assert {k: event_to_dict(resumed)[k] for k in ("principal", "reason")} == {
        "principal": "olivia",
        "reason": "ledger unlocked",
    }
    detail = (await admin.http.get(f"/sagas/{saga_id}", headers=READER)).json()
    assert detail["pending_compensations"] == []


async def test_actions_that_make_no_sense_get_409(admin: Admin) -> None:
    done = await admin.start()
    await admin.settle(done)
    cancel = await admin.http.post(
        f"/sagas/{done}/cancel", json={"reason": "late"}, headers=OPERATOR
    )
    assert cancel.status_code == 409
    assert cancel.json() == {
        "detail": f"saga {done} is completed; it accepts no cancel any more",
        "error": "InvalidTransition",
    }
    running = await waiting_saga(admin)
    resume = await admin.http.post(
        f"/sagas/{running}/resume", json={"reason": "why"}, headers=OPERATOR
    )
    assert resume.status_code == 409
    assert "only a saga whose compensation is stuck" in resume.json()["detail"]
    stuck = await stuck_saga(admin)
    cancel_stuck = await admin.http.post(
        f"/sagas/{stuck}/cancel", json={"reason": "r"}, headers=OPERATOR
    )
    assert cancel_stuck.status_code == 409


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("cancel", {}),
        ("cancel", {"reason": "   "}),
        ("cancel", {"reason": "r", "force": True}),
        ("resume", {}),
        ("resume", {"reason": 7}),
        ("signal", {}),
        ("signal", {"name": ""}),
        ("signal", {"name": "a", "payload": [1]}),
        ("signal", {"name": "a", "signal_id": ""}),
    ],
)
async def test_actions_validate_their_body(admin: Admin, action: str, body: dict[str, Any]) -> None:
    saga_id = await waiting_saga(admin)
    response = await admin.http.post(f"/sagas/{saga_id}/{action}", json=body, headers=OPERATOR)
    assert response.status_code == 422, response.text
    assert response.json()["detail"]


async def test_malformed_json_in_an_action_is_4xx(admin: Admin) -> None:
    saga_id = await waiting_saga(admin)
    for content, ctype in [
        (b'{"reason": ', "application/json"),
        (b"reason=x", "text/plain"),
        (b"", "application/json"),
    ]:
        response = await admin.http.post(
            f"/sagas/{saga_id}/cancel", content=content, headers={**OPERATOR, "Content-Type": ctype}
        )
        assert 400 <= response.status_code < 500, response.text
    assert (await admin.settle(saga_id)) == SagaStatus.RUNNING


# --------------------------------------------------------------------------- metrics and meta


async def test_metrics_as_json_and_prometheus_text(admin: Admin) -> None:
    await waiting_saga(admin)
    stuck = await stuck_saga(admin)
    stuck_since = (await admin.env.engine.get(stuck)).updated_at
    await admin.env.advance(timedelta(minutes=5))
    admin.env.parts.stats.inc("dead_lettered", 2)

    response = await admin.http.get("/metrics", headers=READER)
    assert response.status_code == 200
    body = response.json()
    assert body["open_sagas"] == {
        "running": 1,
        "compensating": 0,
        "compensation_stuck": 1,
        "nondeterministic": 0,
        "step_stuck": 0,
    }
    assert body["open_total"] == 2
    age = (admin.env.now() - stuck_since).total_seconds()
    assert body["oldest_stuck_age_seconds"] == pytest.approx(age)
    assert age >= 300
    assert body["dead_lettered"] == 2
    assert body["counters"]["sagas_started"] == 2
    assert body["counters"]["sagas_parked"] == 1

    text = await admin.http.get("/metrics", headers={**READER, "Accept": "text/plain"})
    assert text.status_code == 200
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = text.text.splitlines()
    assert 'saga_open_sagas{status="running"} 1' in lines
    assert 'saga_open_sagas{status="compensation_stuck"} 1' in lines
    assert f"saga_oldest_stuck_age_seconds {age}" in lines
    assert "saga_dead_lettered_total 2" in lines
    assert "saga_engine_sagas_started_total 2" in lines
    assert "# TYPE saga_open_sagas gauge" in lines
    scraper = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    assert (
        await admin.http.get("/metrics", headers={**READER, "Accept": scraper})
    ).text == text.text


async def test_health_needs_no_token_and_types_are_listed(admin: Admin) -> None:
    assert (await admin.http.get("/health")).json() == {"status": "ok"}
    types = (await admin.http.get("/saga-types", headers=READER)).json()
    assert [t["name"] for t in types] == ["noop", "transfer"]
    assert "amount" in types[1]["input_schema"]["properties"]


async def test_openapi_describes_the_api(admin: Admin) -> None:
    spec = (await admin.http.get("/openapi.json")).json()
    assert set(spec["paths"]) == {
        "/health",
        "/callbacks/{token}",
        "/callbacks/{token}/fail",
        "/saga-types",
        "/saga-types/{name}/insights",
        "/saga-types/{name}/insights/policies",
        "/saga-types/{name}",
        "/sagas",
        "/sagas/{saga}",
        "/sagas/{saga_id}/history",
        "/sagas/{saga_id}/lineage",
        "/sagas/{saga_id}/stream",
        "/sagas/{saga_id}/graph",
        "/metrics",
        "/flow",
        "/flow/policies",
        "/flow/policies/rollout",
        "/domain-events",
        "/concurrency-keys",
        "/sagas/{saga_id}/signal",
        "/sagas/{saga_id}/cancel",
        "/sagas/{saga_id}/resume",
        "/sagas/{saga_id}/retry",
        "/sagas/{saga_id}/skip",
        "/sagas/{saga_id}/force-compensate",
        "/sagas/{saga_id}/rerun",
        "/sagas/{saga_id}/updates/{name}",
        "/sagas/{saga_id}/queries/{name}",
        "/rollouts",
        "/rollouts/{saga_type}",
        "/schedules",
        "/schedules/{schedule_id}",
        "/schedules/{schedule_id}/pause",
        "/schedules/{schedule_id}/resume",
        "/schedules/{schedule_id}/trigger",
        "/batch-operations",
        "/batch-operations/{operation_id}",
        "/batch-operations/{operation_id}/cancel",
        "/dead-letters",
        "/dead-letters/{partition}/{offset}",
        "/dead-letters/{partition}/{offset}/replay",
    }
    assert set(spec["paths"]["/sagas/{saga}"]) == {"get", "post"}
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    start = spec["paths"]["/sagas/{saga}"]["post"]
    [saga] = [p for p in start["parameters"] if p["name"] == "saga"]
    assert saga["schema"]["enum"] == ["noop", "transfer"]


# --------------------------------------------------------------------------- failures


async def test_an_unexpected_error_is_a_logged_generic_500(
    admin: Admin, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("boom: internal detail")

    monkeypatch.setattr(admin.env.store, "list_sagas", broken)
    response = await admin.http.get("/sagas", headers=READER)
    assert response.status_code == 500
    assert response.json() == {"detail": "internal error; the engine log has the details"}
    assert "boom" not in response.text
    assert "boom: internal detail" in caplog.text


async def test_an_unavailable_store_is_503_with_retry_after(
    admin: Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def away(_: str, **__: Any) -> Any:  # load(saga_id, undecodable=...)
        raise TransientError("Postgres is unavailable")

    monkeypatch.setattr(admin.env.store, "load", away)
    monkeypatch.setattr(admin.env.store, "load_run", away)  # (a saga's view reads its run)
    response = await admin.http.get("/sagas/x", headers=READER)
    assert response.status_code == 503
    assert response.headers["retry-after"] == "2"
    assert response.json()["detail"] == "Postgres is unavailable"


async def test_the_client_sees_json_errors_everywhere(admin: Admin) -> None:
    for response in [
        await admin.http.get("/sagas/missing", headers=READER),
        await admin.http.get("/sagas?limit=0", headers=READER),
        await admin.http.get("/sagas"),
        await admin.http.post("/sagas/x/cancel", json={"reason": "r"}, headers=READER),
    ]:
        assert response.headers["content-type"] == "application/json"
        assert isinstance(response.json()["detail"], str | list)

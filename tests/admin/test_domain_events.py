"""Domain events seen by an operator: a waiting saga's view (``waiting_for`` of kind
``event``, its timeline), the page, ``GET /domain-events`` (the facts kept, ``unmatched``
ones alone), its 422 on a bad query, and ``saga events``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from saga_engine.admin import create_admin_app
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import READER, READER_TOKEN, admin_settings, make_client
from tests.admin.served import Served, served_in_thread
from tests.cli.conftest import as_json, invoke
from tests.events.sagas import AwaitPayment, Order, PaymentCaptured, payment_captured


def _env(**admin: Any) -> SagaTestEnv:
    return SagaTestEnv(
        [AwaitPayment], settings=admin_settings(**admin), event_sources=[payment_captured]
    )


async def test_a_waiting_saga_shows_what_it_waits_for_and_the_facts_are_listed() -> None:
    env = _env()
    env.participant("shipping").on("Ship", no_reply=True)
    run = await env.start(AwaitPayment, Order(order_id=42, timeout_s=600))
    await env.publish_event(PaymentCaptured(order_id=7, amount=1), event_id="nobody")
    app = create_admin_app(env.engine, env.settings, parts=env.parts, schedules=env.schedules)
    async with make_client(app) as http:
        view = (await http.get(f"/sagas/{run.saga_id}", headers=READER)).json()
        [wait] = view["waiting_for"]
        assert wait["kind"] == "event"
        assert wait["what"] == "event PaymentCaptured key=42"
        assert wait["until"] is not None
        page = await http.get(f"/ui/sagas/{run.saga_id}", headers=READER)
        assert page.status_code == 200
        assert "event PaymentCaptured key=42" in page.text  # what it waits for
        assert "wait for PaymentCaptured key=42" in page.text  # its timeline's row
        body = (await http.get("/domain-events", headers=READER)).json()
        assert body["enabled"] is True
        assert [(e["key"], e["event_id"], e["matched"]) for e in body["events"]] == [
            ("7", "nobody", False)
        ]
        await env.publish_event(PaymentCaptured(order_id=42, amount=5), event_id="cap")
        listed = (await http.get("/domain-events", headers=READER)).json()["events"]
        assert {e["event_id"]: e["matched"] for e in listed} == {"nobody": False, "cap": True}
        only = await http.get("/domain-events?unmatched=true", headers=READER)
        assert [e["event_id"] for e in only.json()["events"]] == ["nobody"]
        bad = await http.get("/domain-events?limit=0", headers=READER)
        assert bad.status_code == 422, bad.text
        assert bad.json()["detail"][0]["loc"] == ["query", "limit"]
        done = (await http.get(f"/sagas/{run.saga_id}", headers=READER)).json()
        assert done["status"] == "running"  # waiting for its shipping step now
        assert [w["kind"] for w in done["waiting_for"]] == ["reply"]
        history = (await http.get(f"/sagas/{run.saga_id}/history", headers=READER)).json()
        kinds = [e["kind"] for e in history["events"]]
        assert kinds[:3] == ["saga_started", "event_awaited", "domain_event_received"]


async def _seed(env: SagaTestEnv) -> dict[str, str]:
    await env.publish_event(
        PaymentCaptured(order_id=3, amount=1), event_id="kept", source=payment_captured
    )
    return {}


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_in_thread(admin_settings(port=0), _seed, sagas=[AwaitPayment]) as running:
        yield running


def test_saga_events_lists_the_facts_kept(served: Served) -> None:
    env = {"SAGA_ADMIN_TOKEN": READER_TOKEN, "SAGA_ADMIN_URL": served.url}
    body = as_json(invoke(["events", "--unmatched", "--json"], env))
    assert [(e["source"], e["key"], e["event_id"]) for e in body["events"]] == [
        ("PaymentCaptured", "3", "kept")
    ]
    table = invoke(["events"], env)
    assert table.exit_code == 0, table.stderr
    assert "PaymentCaptured" in table.stdout
    assert "kept" in table.stdout

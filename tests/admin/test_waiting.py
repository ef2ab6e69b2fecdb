"""What a saga waits for, found by its business keys: ``waiting_for`` on the API, the
search attributes filter, and a stuck compensation skipped without a result."""

from __future__ import annotations

from datetime import timedelta

from saga_engine import SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR, READER, Admin, admin_settings, make_client
from tests.admin.graph_sagas import Do, Fulfil, OrderIn, Undo
from tests.admin.sagas import Credit, Refund


async def test_waiting_for_names_the_signal_then_nothing_once_ended(admin: Admin) -> None:
    saga_id = await admin.start(wait_for_approval=True)
    assert await admin.settle(saga_id) == SagaStatus.RUNNING
    body = (await admin.http.get(f"/sagas/{saga_id}", headers=READER)).json()
    [wait] = body["waiting_for"]
    assert (wait["kind"], wait["name"], wait["until"]) == ("signal", "approve", None)
    assert "signal 'approve'" in wait["what"]
    assert body["in_flight"] == []

    sent = await admin.http.post(
        f"/sagas/{saga_id}/signal",
        json={"name": "approve", "payload": {"by": "ann"}},
        headers=OPERATOR,
    )
    assert sent.status_code == 200, sent.text
    assert await admin.settle(saga_id) == SagaStatus.COMPLETED
    done = (await admin.http.get(f"/sagas/{saga_id}", headers=READER)).json()
    assert done["waiting_for"] == []


async def test_waiting_for_a_reply_shows_the_step_in_flight(admin: Admin) -> None:
    admin.env.participant("ledger").on("Debit", no_reply=True)
    saga_id = await admin.start()
    await admin.env.settle()
    body = (await admin.http.get(f"/sagas/{saga_id}", headers=READER)).json()
    [wait] = body["waiting_for"]
    assert (wait["kind"], wait["step"], wait["attempt"]) == ("reply", "debit", 1)
    assert "from 'ledger'" in wait["what"]
    [sent] = body["in_flight"]
    assert (sent["step"], sent["participant"], sent["compensation"]) == ("debit", "ledger", False)


async def test_list_by_a_search_attribute(admin: Admin) -> None:
    first = await admin.start(account="acc-7")
    await admin.start(account="acc-8")
    found = await admin.http.get("/sagas", params={"account": "acc-7"}, headers=READER)
    assert found.status_code == 200, found.text
    assert [s["saga_id"] for s in found.json()["items"]] == [first]
    none = await admin.http.get("/sagas", params={"account": "acc-9"}, headers=READER)
    assert none.json()["items"] == []
    typo = await admin.http.get("/sagas", params={"acount": "acc-7"}, headers=READER)
    assert typo.status_code == 422
    assert "unknown filter 'acount'" in typo.json()["detail"]
    assert "account" in typo.json()["detail"]  # it names the ones that exist


async def test_a_stuck_compensation_is_skipped_without_a_result(admin: Admin) -> None:
    admin.env.participant("payee").on(Credit, reject="closed", times=1)
    admin.env.participant("ledger").on(Refund, reject="locked", times=2)
    saga_id = await admin.start()
    assert await admin.settle(saga_id) == SagaStatus.COMPENSATION_STUCK
    body = (await admin.http.get(f"/sagas/{saga_id}", headers=READER)).json()
    [wait] = body["waiting_for"]
    assert (wait["kind"], wait["step"], wait["compensation"]) == ("operator", "debit", True)

    wrong = await admin.http.post(
        f"/sagas/{saga_id}/skip", json={"step": "credit", "reason": "r"}, headers=OPERATOR
    )
    assert wrong.status_code == 422
    assert "needs a result" in wrong.json()["detail"]
    assert "'debit'" in wrong.json()["detail"]  # it names the stuck one
    skipped = await admin.http.post(
        f"/sagas/{saga_id}/skip",
        json={"step": "debit", "reason": "refunded by hand"},
        headers=OPERATOR,
    )
    assert skipped.status_code == 200, skipped.text
    assert skipped.json()["status"] == "compensated"


async def test_two_compensations_stuck_at_once_are_each_skipped_without_a_result() -> None:
    """A graph's independent steps are undone in parallel: both refused, both stuck; an
    operator skips each, in any order, without a result."""
    env = SagaTestEnv([Fulfil], settings=admin_settings())
    for name in ("inventory", "payments", "warehouse", "mailer"):
        env.participant(name).on(Do, reply={}).on(Undo, reply={})
    env.participant("shipping").on(Do, reject="no carrier")
    env.participant("inventory").on(Undo, reject="locked")
    env.participant("payments").on(Undo, reject="locked")
    app = create_admin_app(env.engine, env.settings, parts=env.parts)
    async with make_client(app) as http:
        run = await env.start(Fulfil, OrderIn(order="o-1", lines=[]))
        await env.run_until_settled(run)
        for _ in range(50):  # the other may still be in its back-off: its timers fire
            body = (await http.get(f"/sagas/{run.saga_id}", headers=READER)).json()
            stuck = [w["step"] for w in body["waiting_for"] if w["kind"] == "operator"]
            if len(stuck) == 2:
                break
            await env.advance(timedelta(minutes=10))
        assert body["status"] == "compensation_stuck"
        assert sorted(stuck) == ["charge", "reserve"]
        for step, status in ((stuck[1], "compensation_stuck"), (stuck[0], "compensated")):
            skipped = await http.post(
                f"/sagas/{run.saga_id}/skip",
                json={"step": step, "reason": "undone by hand"},
                headers=OPERATOR,
            )
            assert skipped.status_code == 200, skipped.text
            await env.settle()
            assert (await run.status()).value == status

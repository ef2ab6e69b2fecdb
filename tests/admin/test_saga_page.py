"""The saga page for an operator on call: an open saga's timeline runs to now, with
relative times; only the actions the saga's state accepts (the same list as
``GET /sagas/{id}``'s ``actions``); a back-off with its attempt and last error; and
the re-send of a step waiting for its reply, audited."""

from __future__ import annotations

import logging
import re
from datetime import timedelta

import pytest

from saga_engine import SagaStatus
from tests.admin.conftest import OPERATOR, READER, Admin
from tests.admin.sagas import Credit, Refund


def _forms(page: str) -> dict[str, str]:
    """The page's action forms: {action: its data-steps}."""
    return dict(re.findall(r'data-action="([a-z-]+)" data-asks="[^"]*" data-steps="([^"]*)"', page))


async def _actions(admin: Admin, saga_id: str) -> dict[str, list[str]]:
    detail = (await admin.http.get(f"/sagas/{saga_id}", headers=READER)).json()
    return {a["name"]: a["steps"] for a in detail["actions"]}


async def test_an_open_saga_s_timeline_runs_to_now_with_relative_times(admin: Admin) -> None:
    saga_id = await admin.start(wait_for_approval=True)
    await admin.env.settle()
    await admin.env.advance(timedelta(hours=2, minutes=5))
    page = (await admin.http.get(f"/ui/sagas/{saga_id}", headers=READER)).text
    assert "(waiting 2 h 5 m)" in page
    assert "(now: the saga is still open, 2 h 5 m so far)" in page
    now = admin.env.now().isoformat(sep=" ", timespec="milliseconds")
    assert f"→ {now}" in page  # the axis ends now, not at the last event
    # Both steps ran in the first instant: on a two-hour axis their bars are slivers.
    widths = [float(w) for w in re.findall(r'class="bar fwd[^"]*"[^>]*width="([\d.]+)"', page)]
    assert widths
    assert max(widths) <= 1.0
    # A saga going forward takes signals and updates.
    assert set(_forms(page)) == {"cancel", "force-compensate"}
    assert 'data-action="signal"' in page
    assert await _actions(admin, saga_id) == {
        "signal": [],
        "cancel": [],
        "force-compensate": [],
    }


async def test_a_compensation_back_off_offers_retry_and_no_signal(admin: Admin) -> None:
    admin.env.participant("payee").on(Credit, reject="account closed")
    admin.env.participant("ledger").on(Refund, retryable="ledger busy", times=1)
    saga_id = await admin.start(wait_for_approval=True)
    await admin.env.settle()
    page = (await admin.http.get(f"/ui/sagas/{saga_id}", headers=READER)).text
    assert 'class="status s-compensating"' in page
    assert _forms(page) == {"retry": "debit"}
    assert 'data-action="signal"' not in page
    assert 'data-action="update"' not in page
    assert await _actions(admin, saga_id) == {"retry": ["debit"]}
    assert "after attempt 1" in page
    assert "last error: ledger busy" in page
    detail = (await admin.http.get(f"/sagas/{saga_id}", headers=READER)).json()
    [wait] = detail["waiting_for"]
    assert (wait["kind"], wait["attempt"], wait["last_error"]) == ("backoff", 1, "ledger busy")
    retried = await admin.http.post(
        f"/sagas/{saga_id}/retry",
        json={"step": "debit", "reason": "ledger back"},
        headers=OPERATOR,
    )
    assert retried.status_code == 200, retried.text
    await admin.env.settle()
    assert (await admin.env.engine.get(saga_id)).status == SagaStatus.COMPENSATED


async def test_a_step_waiting_for_its_reply_is_re_sent_under_its_id(admin: Admin) -> None:
    admin.env.participant("payee").on(Credit, no_reply=True, times=1)
    saga_id = await admin.start()
    await admin.env.settle()
    assert (await _actions(admin, saga_id))["retry"] == ["credit"]
    page = (await admin.http.get(f"/ui/sagas/{saga_id}", headers=READER)).text
    assert _forms(page)["retry"] == "credit"
    assert "Retry / re-send step" in page
    refused = await admin.http.post(
        f"/sagas/{saga_id}/retry", json={"step": "debit", "reason": "x"}, headers=OPERATOR
    )
    assert refused.status_code == 409
    assert "can be neither retried nor re-sent" in refused.text
    assert "re-send one of [&#39;credit&#39;]" in refused.text or "['credit']" in refused.text
    resent = await admin.http.post(
        f"/sagas/{saga_id}/retry",
        json={"step": "credit", "reason": "payee lost it"},
        headers=OPERATOR,
    )
    assert resent.status_code == 200, resent.text
    await admin.env.settle()
    assert (await admin.env.engine.get(saga_id)).status == SagaStatus.COMPLETED
    sent = admin.env.commands("payee")
    assert len(sent) == 2
    assert sent[0].command_id == sent[1].command_id
    history = (await admin.http.get(f"/sagas/{saga_id}/history", headers=READER)).json()
    [retry] = [e for e in history["events"] if e["kind"] == "retry_requested"]
    assert (retry["step"], retry["principal"], retry["reason"]) == (
        "credit",
        "olivia",
        "payee lost it",
    )


async def test_the_schedules_page_shows_the_last_saga_and_acts_through_the_api(
    admin: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"id": "nightly", "saga": "noop", "cron": "0 3 * * *", "input": {}}
    assert (await admin.http.post("/schedules", json=body, headers=OPERATOR)).status_code == 201
    page = (await admin.http.get("/ui/schedules", headers=READER)).text
    for action in ("pause", "trigger", "delete"):
        assert f'action="/ui/schedules/nightly/{action}"' in page, action
    assert 'data-api="/schedules/nightly" data-method="DELETE"' in page
    assert 'data-api="/schedules/nightly/trigger" data-method="POST"' in page
    assert "<script>" not in page  # the buttons' script is admin.js (the CSP is unchanged)
    # A reader may look, not act.
    assert (
        await admin.http.post("/ui/schedules/nightly/trigger", headers=READER)
    ).status_code == 403
    with caplog.at_level(logging.INFO, logger="saga_engine.admin.audit"):
        fired = await admin.http.post("/ui/schedules/nightly/trigger", headers=OPERATOR)
        assert fired.status_code == 303
        await admin.env.settle()
        saga_id = (await admin.http.get("/schedules/nightly", headers=READER)).json()[
            "last_saga_id"
        ]
        page = (await admin.http.get("/ui/schedules", headers=READER)).text
        assert re.search(
            rf'href="/ui/sagas/{re.escape(saga_id)}"><span class="status s-completed">completed',
            page,
        )
        assert (await admin.http.post("/ui/schedules/nightly/pause", headers=OPERATOR)).is_redirect
        assert (
            'action="/ui/schedules/nightly/resume"'
            in (await admin.http.get("/ui/schedules", headers=READER)).text
        )
        assert (await admin.http.post("/ui/schedules/nightly/delete", headers=OPERATOR)).is_redirect
    assert (await admin.http.get("/schedules/nightly", headers=READER)).status_code == 404
    audited = [r.getMessage() for r in caplog.records if r.name == "saga_engine.admin.audit"]
    assert any("nightly triggered by olivia" in line for line in audited), audited
    assert any("nightly paused by olivia" in line for line in audited), audited
    assert any("nightly deleted by olivia" in line for line in audited), audited

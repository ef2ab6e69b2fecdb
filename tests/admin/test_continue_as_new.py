"""A saga that continued as new, seen by an operator (issue 41 §4): ``GET /sagas/{id}``
and the saga page read the current run only, show the chain of runs and number the
run's events as the store does; a run past ``engine.continue_as_new_after`` without
continuing is flagged on both; the page's history table is a page at a time."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import SecretStr

from saga_engine.admin import create_admin_app
from saga_engine.settings import AdminSettings, EngineSettings, Settings
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import OPERATOR_TOKEN, READER, READER_TOKEN, Admin, make_client
from tests.test_continue_as_new import Billing, Charge, LongSubscription, Refund, Subscription


def _settings(bound: int) -> Settings:
    admin: dict[str, Any] = {
        "operators": {"olivia": SecretStr(OPERATOR_TOKEN)},
        "readers": {"rita": SecretStr(READER_TOKEN)},
    }
    return Settings(
        admin=AdminSettings(**admin), engine=EngineSettings(continue_as_new_after=bound)
    )


@pytest.fixture
async def looping() -> AsyncIterator[Admin]:
    env = SagaTestEnv([Subscription, LongSubscription], settings=_settings(bound=20))
    env.participant("payments").on(Charge, reply={}).on(Refund, reply={})
    app = create_admin_app(env.engine, env.settings, parts=env.parts)
    async with make_client(app) as http:
        yield Admin(env, app, http)


async def test_the_detail_and_the_page_show_the_current_run_and_the_chain(
    looping: Admin,
) -> None:
    run = await looping.env.start(Subscription, Billing(until=10))
    for _ in range(3):
        await looping.env.advance(timedelta(days=30))
    detail = (await looping.http.get(f"/sagas/{run.saga_id}", headers=READER)).json()
    assert detail["run"] == 4
    assert [r["run"] for r in detail["runs"]] == [1, 2, 3, 4]
    whole = await looping.env.store.load(run.saga_id)
    assert sum(r["events"] for r in detail["runs"]) == whole.record.last_seq
    current = detail["runs"][-1]
    assert detail["events"] == 1 + current["events"]  # its saga_started, then the run
    assert detail["history_warning"] is None
    # Owed: the charge of this run, and those carried from the runs before, last first.
    assert [p["step"] for p in detail["pending_compensations"]] == [
        "charge-3",
        "charge-2@run3",
        "charge-1@run2",
        "charge-0@run1",
    ]
    page = (await looping.http.get(f"/ui/sagas/{run.saga_id}", headers=READER)).text
    assert 'id="runs"' in page
    assert "run 1 (" in page
    # The run's events keep their numbers in the saga's history.
    seqs = [int(n) for n in re.findall(r'<tr class="k-[a-z_]+">\s*<td>(\d+)</td>', page)]
    assert seqs[0] == 1
    assert seqs[1] == current["first_seq"]
    assert seqs[-1] == whole.record.last_seq


async def test_a_long_run_without_continuing_is_flagged_and_paged(
    looping: Admin, caplog: pytest.LogCaptureFixture
) -> None:
    run = await looping.env.start(LongSubscription, Billing(until=200))
    with caplog.at_level(logging.WARNING):
        for _ in range(120):
            await looping.env.advance(timedelta(days=30))
    warned = [r.getMessage() for r in caplog.records if "continue_as_new_after" in r.getMessage()]
    assert len(warned) == 1  # once, as the run passes the bound
    assert run.saga_id in warned[0]
    detail = (await looping.http.get(f"/sagas/{run.saga_id}", headers=READER)).json()
    assert len(detail["runs"]) == 1
    assert "continue_as_new_after=20" in detail["history_warning"]
    page = (await looping.http.get(f"/ui/sagas/{run.saga_id}", headers=READER)).text
    assert 'id="history-warning"' in page
    assert 'id="events-pages"' in page
    assert 'id="timeline-pages"' in page  # its 240 rows, 100 at a time
    rows = re.findall(r'<tr class="k-[a-z_]+">\s*<td>(\d+)</td>', page)
    assert 0 < len(rows) <= 200
    assert int(rows[-1]) == detail["events"]  # the newest page by default
    first = (await looping.http.get(f"/ui/sagas/{run.saga_id}?events_page=1", headers=READER)).text
    assert re.findall(r'<tr class="k-[a-z_]+">\s*<td>(\d+)</td>', first)[:2] == ["1", "2"]

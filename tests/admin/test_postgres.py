"""The admin API on the Postgres event store: listing, filters, paging, NUL-safe ids."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from pydantic import SecretStr

from saga_engine import SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.replay import load_history
from saga_engine.settings import AdminSettings, PostgresSettings, Settings
from saga_engine.store import PostgresEventStore, migrate
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.conftest import OPERATOR, OPERATOR_TOKEN, READER, READER_TOKEN, make_client
from tests.admin.sagas import Credit, Noop, Refund, Transfer
from tests.conftest import PgTarget

pytestmark = pytest.mark.integration


@pytest.fixture
async def pg_store(pg: PgTarget) -> AsyncIterator[PostgresEventStore]:
    await migrate(pg.database_dsn, pg.schema)
    store = await PostgresEventStore.connect(
        PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    )
    yield store
    await store.close()


async def test_listing_and_reading_on_postgres(pg_store: PostgresEventStore) -> None:
    settings = Settings(
        admin=AdminSettings(
            operators={"olivia": SecretStr(OPERATOR_TOKEN)},
            readers={"rita": SecretStr(READER_TOKEN)},
        )
    )
    env = SagaTestEnv([Transfer, Noop], settings=settings, store=pg_store)
    t0 = env.now()
    app = create_admin_app(env.engine, settings, parts=env.parts, schedules=env.schedules)
    noops = [await env.engine.start(Noop, {}) for _ in range(120)]
    await env.advance(timedelta(hours=1))
    env.participant("payee").on(Credit, reject="closed", times=1)
    env.participant("ledger").on(Refund, reject="locked", times=2)
    async with make_client(app) as http:
        started = await http.post(
            "/sagas/transfer", json={"account": "a", "amount": 1}, headers=OPERATOR
        )
        stuck = started.json()["saga_id"]
        assert await env.run_until_settled(SagaRun(env, stuck, Transfer)) == (
            SagaStatus.COMPENSATION_STUCK
        )

        async def all_pages(**query: Any) -> tuple[list[str], int]:
            ids: list[str] = []
            pages = 0
            cursor = None
            while True:
                params = {"sort": "id", **query, **({"cursor": cursor} if cursor else {})}
                response = await http.get("/sagas", params=params, headers=READER)
                assert response.status_code == 200, response.text
                page = response.json()
                ids += [i["saga_id"] for i in page["items"]]
                pages += 1
                cursor = page["next_cursor"]
                if cursor is None:
                    return ids, pages

        everything = sorted([*noops, stuck])
        assert await all_pages(limit=50) == (everything, 3)
        # By last activity: the stuck saga moved last; each saga once, newest first.
        by_activity, _ = await all_pages(limit=50, sort="activity")
        assert by_activity[0] == stuck
        assert sorted(by_activity) == everything
        assert (await all_pages(status="compensation_stuck"))[0] == [stuck]
        assert (await all_pages(type="noop", limit=500))[0] == sorted(noops)
        later = (t0 + timedelta(minutes=30)).isoformat()
        assert (await all_pages(created_after=later))[0] == [stuck]
        # The id prefix is a range of the primary key: one request finds the match.
        assert await all_pages(q=stuck[:12]) == ([stuck], 1)
        assert (await all_pages(q="\u00e9t\u00e9"))[0] == []

        detail = (await http.get(f"/sagas/{stuck}", headers=READER)).json()
        assert detail["pending_compensations"][0]["state"] == "stuck"
        history = await http.get(f"/sagas/{stuck}/history", headers=READER)
        assert load_history(history.content).saga_id == stuck
        # Ids and filters Postgres cannot hold are answered, not crashed on.
        assert (await http.get("/sagas/a%00b", headers=READER)).status_code == 422
        assert (await http.get("/sagas?type=a%00b", headers=READER)).status_code == 422
        assert (await http.get(f"/sagas/{'x' * 201}", headers=READER)).status_code == 404
        waiting = (
            await http.post(
                "/sagas/transfer",
                json={"account": "w", "amount": 1, "wait_for_approval": True},
                headers=OPERATOR,
            )
        ).json()["saga_id"]
        assert await env.run_until_settled(SagaRun(env, waiting, Transfer)) == SagaStatus.RUNNING
        nul = await http.post(
            f"/sagas/{waiting}/signal",
            json={"name": "approve", "payload": {"by": "\u0000"}},
            headers=OPERATOR,
        )
        assert nul.status_code == 422, nul.text
        assert nul.json()["error"] == "UnstorableValue"
        assert nul.json()["detail"][0]["loc"] == ["body", "payload", "by"]
        ok = await http.post(
            f"/sagas/{waiting}/signal",
            json={"name": "approve", "payload": {"by": "o"}},
            headers=OPERATOR,
        )
        assert ok.status_code == 200, ok.text
        assert await env.run_until_settled(SagaRun(env, waiting, Transfer)) == SagaStatus.COMPLETED

        resumed = await http.post(
            f"/sagas/{stuck}/resume", json={"reason": "fixed"}, headers=OPERATOR
        )
        assert resumed.status_code == 200, resumed.text
        assert await env.run_until_settled(SagaRun(env, stuck, Transfer)) == SagaStatus.COMPENSATED
        metrics = (await http.get("/metrics", headers=READER)).json()
        assert metrics["open_total"] == 0
        assert metrics["oldest_stuck_age_seconds"] is None

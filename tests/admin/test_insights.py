"""GET /saga-types/{name}/insights on the Postgres store: the aggregates the group
commit keeps as runs end, served with the SLA and its breaching runs; bad input is a
clear 4xx."""

from __future__ import annotations

from datetime import timedelta

import pytest

from saga_engine import DefinitionError, SagaStatus
from saga_engine.admin import create_admin_app
from saga_engine.store import PostgresEventStore
from saga_engine.testing import SagaRun, SagaTestEnv
from tests.admin.conftest import READER, admin_settings, make_client
from tests.admin.sagas import Credit, Noop, Transfer
from tests.admin.test_postgres import pg_store

pytestmark = pytest.mark.integration

__all__ = ["pg_store"]  # the fixture, shared with the admin API's Postgres tests


class TimedTransfer(Transfer):
    """The admin tests' transfer, promised in a minute."""

    name = "timed-transfer"
    sla = timedelta(minutes=1)


async def test_insights_of_a_type_on_postgres(pg_store: PostgresEventStore) -> None:
    env = SagaTestEnv([TimedTransfer, Noop], settings=admin_settings(), store=pg_store)
    app = create_admin_app(env.engine, env.settings, parts=env.parts)
    env.participant("payee").on(Credit, reject="account closed", times=1)
    refused = await env.engine.start(TimedTransfer, {"account": "a", "amount": 1})
    assert await env.run_until_settled(SagaRun(env, refused, TimedTransfer)) == (
        SagaStatus.COMPENSATED
    )
    quick = [
        await env.engine.start(TimedTransfer, {"account": f"q{i}", "amount": 2}) for i in range(3)
    ]
    for saga_id in quick:
        assert await env.run_until_settled(SagaRun(env, saga_id, TimedTransfer)) == (
            SagaStatus.COMPLETED
        )
    slow = await env.engine.start(
        TimedTransfer, {"account": "s", "amount": 3, "wait_for_approval": True}
    )
    await env.run_until_settled(SagaRun(env, slow, TimedTransfer))
    async with make_client(app) as http:
        # Still waiting: not counted yet.
        body = (await http.get("/saga-types/timed-transfer/insights", headers=READER)).json()
        assert body["runs"] == 4
        await env.advance(timedelta(minutes=5))
        await env.signal(slow, "approve", {"by": "olivia"})
        assert await env.run_until_settled(SagaRun(env, slow, TimedTransfer)) == (
            SagaStatus.COMPLETED
        )
        response = await http.get(
            "/saga-types/timed-transfer/insights", params={"window": "1d"}, headers=READER
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["window"] == "1d"
        assert body["runs"] == 5
        assert body["outcomes"] == {"compensated": 1, "completed": 4}
        nodes = {n["name"]: n for n in body["nodes"]}
        assert [n["name"] for n in body["nodes"]] == ["debit", "credit", "signal:approve"]
        assert (nodes["debit"]["runs"], nodes["debit"]["share"]) == (5, 1.0)
        assert nodes["debit"]["compensation_rate"] == 0.2
        assert nodes["credit"]["refusal_rate"] == 0.2
        assert nodes["credit"]["errors"] == [{"message": "account closed", "count": 1}]
        assert nodes["signal:approve"]["share"] == 0.2
        assert nodes["signal:approve"]["latency_ms"]["p50"] == 300_000
        sla = body["sla"]
        assert (sla["seconds"], sla["within"], sla["breached"]) == (60.0, 4, 1)
        assert sla["breaching_runs"] == [slow]
        # A type without an SLA has none; another type's runs are not these.
        noop = (await http.get("/saga-types/noop/insights", headers=READER)).json()
        assert (noop["runs"], noop["sla"]) == (0, None)
        # Prometheus: the last hour's runs, node latencies and SLA breaches, per type.
        scrape = await http.get("/metrics", headers={**READER, "Accept": "text/plain"})
        assert scrape.status_code == 200
        lines = scrape.text.splitlines()
        assert 'saga_insight_runs{saga_type="timed-transfer",outcome="completed"} 4' in lines
        assert 'saga_insight_sla_breached{saga_type="timed-transfer"} 1' in lines
        assert (
            'saga_insight_node_latency_ms{saga_type="timed-transfer",node="signal:approve",'
            'quantile="0.95"} 300000'
        ) in lines
        assert "# TYPE saga_insight_node_latency_ms gauge" in lines
        # Bad input: a clear 4xx.
        missing = await http.get("/saga-types/nope/insights", headers=READER)
        assert missing.status_code == 404
        assert "nope" in missing.text
        bad = await http.get("/saga-types/noop/insights", params={"window": "2h"}, headers=READER)
        assert bad.status_code == 422
        assert (await http.get("/saga-types/noop/insights")).status_code == 401


def test_an_sla_is_checked_at_definition_time() -> None:
    with pytest.raises(DefinitionError, match="`sla` must be a positive timedelta"):

        class Bad(Noop):
            name = "bad-sla"
            sla = 60  # type: ignore[assignment]

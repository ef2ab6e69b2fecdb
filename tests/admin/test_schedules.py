"""Durable schedules through a real worker: declared in code, created, paused, resumed,
triggered and deleted through the admin API and the ``saga schedule`` CLI, on the real
Postgres and Kafka."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel, Field

from saga_engine import Saga, SagaContext, Signal
from saga_engine.schedules import Overlap, Schedule
from tests.cli.conftest import as_json, invoke, one_line_error
from tests.conftest import PgTarget
from tests.served_worker import OPERATOR_TOKEN, ServedWorker, real_settings, served_worker
from tests.waiting import eventually

pytestmark = pytest.mark.integration

OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


class Day(BaseModel):
    region: str = Field(default="eu", min_length=2, max_length=8)


class Done(BaseModel):
    ok: bool = True


class Reconcile(Saga[Day, Done]):
    name = "reconcile"

    async def run(self, ctx: SagaContext, day: Day) -> Done:
        return Done()


class Finish(BaseModel):
    pass


class LongReport(Saga[Day, Done]):
    """Runs until it is signalled: the previous run of an overlap=skip schedule."""

    name = "long-report"
    finish = Signal(Finish)

    async def run(self, ctx: SagaContext, day: Day) -> Done:
        await ctx.wait_signal(self.finish)
        return Done()


async def _schedule(served: ServedWorker, schedule_id: str) -> dict[str, Any]:
    response = await served.http.get(f"/schedules/{schedule_id}", headers=OPERATOR)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def _status(served: ServedWorker, saga_id: str) -> str | None:
    response = await served.http.get(f"/sagas/{saga_id}", headers=OPERATOR)
    return response.json()["status"] if response.status_code == 200 else None


async def _sagas_per_key(pg: PgTarget) -> dict[str, int]:
    conn = await asyncpg.connect(pg.database_dsn, server_settings={"search_path": pg.schema})
    try:
        rows = await conn.fetch(
            "SELECT idempotency_key, count(*) AS n FROM sagas "
            "WHERE idempotency_key LIKE 'schedule:%' GROUP BY idempotency_key"
        )
    finally:
        await conn.close()
    return {r["idempotency_key"]: r["n"] for r in rows}


async def cli(*args: str, url: str) -> Any:
    # The CLI is synchronous and the admin API is served on this test's loop: off-thread.
    return await asyncio.to_thread(
        invoke, [*args, "--admin-url", url], {"SAGA_ADMIN_TOKEN": OPERATOR_TOKEN}
    )


async def test_schedules_in_code_through_the_api_and_the_cli(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    declared = Schedule(id="every-second", saga=Reconcile, every_s=1, input={"region": "us"})
    async with served_worker(settings, [Reconcile], schedules=[declared]) as served:
        http = served.http
        # Declared in code: it fires every second, and its sagas complete.
        row = await eventually(lambda: _fired(served, "every-second", 2), timeout=30, interval=0.2)
        assert row["origin"] == "code"
        assert row["spec"] == "every 1s"
        assert row["last_saga_url"] == f"/sagas/{row['last_saga_id']}"
        await eventually(lambda: _is(served, row["last_saga_id"], "completed"), timeout=30)

        # The API: create, the same again, another definition, bad input.
        body = {
            "id": "nightly",
            "saga": "reconcile",
            "cron": "0 3 * * *",
            "timezone": "Europe/Paris",
            "input": {"region": "fr"},
        }
        created = await http.post("/schedules", json=body, headers=OPERATOR)
        assert created.status_code == 201, created.text
        assert created.json()["spec"] == "cron 0 3 * * * (Europe/Paris)"
        assert (await http.post("/schedules", json=body, headers=OPERATOR)).status_code == 200
        other = await http.post("/schedules", json={**body, "cron": "0 4 * * *"}, headers=OPERATOR)
        assert other.status_code == 409
        assert "another definition" in other.json()["detail"]
        for bad, where in [
            ({**body, "cron": "0 25 * * *"}, ["body", "cron"]),
            ({**body, "saga": "nope"}, ["body", "saga"]),
            ({**body, "input": {"region": "x"}}, ["body", "input", "region"]),
            ({**body, "catchup": "sometimes"}, ["body", "catchup"]),
            ({**body, "every_s": 60}, ["body"]),
        ]:
            refused = await http.post("/schedules", json=bad, headers=OPERATOR)
            assert refused.status_code == 422, refused.text
            assert refused.json()["detail"][0]["loc"] == where, refused.text
        assert (await http.get("/schedules/nope", headers=OPERATOR)).status_code == 404

        # Pause, resume, trigger, delete.
        paused = await http.post("/schedules/nightly/pause", headers=OPERATOR)
        assert paused.json()["state"] == "paused"
        again = await http.post("/schedules/nightly/pause", headers=OPERATOR)
        assert again.status_code == 409
        resumed = await http.post("/schedules/nightly/resume", headers=OPERATOR)
        assert resumed.json()["state"] == "active"
        triggered = await http.post("/schedules/nightly/trigger", headers=OPERATOR)
        assert triggered.status_code == 200, triggered.text
        saga_id = triggered.json()["saga_id"]
        await eventually(lambda: _is(served, saga_id, "completed"), timeout=30)
        assert (await _schedule(served, "nightly"))["last_saga_id"] == saga_id
        listed = (await http.get("/schedules", headers=OPERATOR)).json()
        assert [s["id"] for s in listed] == ["every-second", "nightly"]
        assert (await http.delete("/schedules/nightly", headers=OPERATOR)).status_code == 204
        assert (await http.delete("/schedules/nightly", headers=OPERATOR)).status_code == 404

        # The web page: spec, state, next and last runs, the last saga linked; pause.
        page = await http.get("/ui/schedules", headers=OPERATOR)
        assert page.status_code == 200, page.text
        assert "every 1s" in page.text
        assert "/ui/schedules/every-second/pause" in page.text
        posted = await http.post("/ui/schedules/every-second/pause", headers=OPERATOR)
        assert posted.status_code == 303
        stopped = await _schedule(served, "every-second")
        assert stopped["state"] == "paused"
        # Paused, its last saga stays the same: the page links it.
        page = await http.get("/ui/schedules", headers=OPERATOR)
        assert f'href="/ui/sagas/{stopped["last_saga_id"]}"' in page.text
        assert "/ui/schedules/every-second/resume" in page.text
        resumed_page = await http.post("/ui/schedules/every-second/resume", headers=OPERATOR)
        assert resumed_page.is_redirect
        assert (await _schedule(served, "every-second"))["state"] == "active"

        # The CLI: the same through the API, with its exit codes.
        url = served.url
        made = as_json(
            await cli(
                "schedule",
                "create",
                "hourly",
                "--saga",
                "reconcile",
                "--cron",
                "0 * * * *",
                "--input",
                '{"region": "de"}',
                "--json",
                url=url,
            )
        )
        assert made["state"] == "active"
        bad_cron = await cli(
            "schedule", "create", "x", "--saga", "reconcile", "--cron", "nope", url=url
        )
        assert "is not a cron expression" in one_line_error(bad_cron, 5)
        assert "nope" in one_line_error(await cli("schedule", "pause", "nope", url=url), 3)
        assert (await cli("schedule", "pause", "hourly", url=url)).exit_code == 0
        assert "already paused" in one_line_error(
            await cli("schedule", "pause", "hourly", url=url), 4
        )
        assert (await cli("schedule", "resume", "hourly", url=url)).exit_code == 0
        fired = await cli("schedule", "trigger", "hourly", url=url)
        assert fired.exit_code == 0, fired.output
        await eventually(lambda: _is(served, fired.stdout.strip(), "completed"), timeout=30)
        table = await cli("schedule", "list", url=url)
        assert "hourly" in table.stdout
        assert "every-second" in table.stdout
        assert (await cli("schedule", "delete", "hourly", url=url)).exit_code == 0
        assert one_line_error(await cli("schedule", "show", "hourly", url=url), 3)
    # Every tick and trigger started one saga, never two.
    per_key = await _sagas_per_key(pg)
    assert len(per_key) >= 4
    assert set(per_key.values()) == {1}


async def _fired(served: ServedWorker, schedule_id: str, n: int) -> dict[str, Any] | None:
    row = await _schedule(served, schedule_id)
    return row if row["fired_count"] >= n else None


async def _is(served: ServedWorker, saga_id: str, status: str) -> bool:
    return await _status(served, saga_id) == status


async def test_overlap_skip_while_the_previous_saga_runs(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    declared = Schedule(id="long", saga=LongReport, every_s=1, overlap=Overlap.SKIP)
    async with served_worker(settings, [LongReport], schedules=[declared]) as served:
        first = await eventually(lambda: _fired(served, "long", 1), timeout=30, interval=0.2)
        saga_id = first["last_saga_id"]
        await eventually(lambda: _is(served, saga_id, "running"), timeout=30)
        # Ticks come and are skipped while it runs.
        row = await eventually(lambda: _skipped(served, "long", 2), timeout=30, interval=0.2)
        assert row["fired_count"] == 1
        assert row["last_saga_id"] == saga_id
        signalled = await served.http.post(
            f"/sagas/{saga_id}/signal",
            json={"name": "finish", "payload": {}, "reason": "done"},
            headers=OPERATOR,
        )
        assert signalled.status_code == 200, signalled.text
        await eventually(lambda: _is(served, saga_id, "completed"), timeout=30)
        # Ended: the next tick fires again.
        after = await eventually(lambda: _fired(served, "long", 2), timeout=30, interval=0.2)
        assert after["last_saga_id"] != saga_id


async def _skipped(served: ServedWorker, schedule_id: str, n: int) -> dict[str, Any] | None:
    row = await _schedule(served, schedule_id)
    return row if row["skipped_count"] >= n else None

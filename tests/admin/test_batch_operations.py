"""Batch operations through a real worker on the real Postgres and Kafka: a dry run, an
operation over many sagas and its progress, a signal to many, the operation cancelled
midway, bad input refused with nothing recorded, auth and audit."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
import orjson
import pytest
from pydantic import BaseModel

from saga_engine import InvalidPayload, InvalidTransition, Saga, SagaContext, Settings, Signal
from saga_engine.client import SagaClient
from saga_engine.settings import BatchSettings
from tests.cli.conftest import as_json, invoke, one_line_error
from tests.conftest import PgTarget
from tests.served_worker import (
    OPERATOR_TOKEN,
    READER_TOKEN,
    ServedWorker,
    real_settings,
    served_worker,
)
from tests.waiting import eventually

pytestmark = pytest.mark.integration

OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
READER = {"Authorization": f"Bearer {READER_TOKEN}"}


class Job(BaseModel):
    region: str


class Go(BaseModel):
    speed: int


class Done(BaseModel):
    speed: int = 0


class Parked(Saga[Job, Done]):
    """Waits for ``go``: a running saga an operation can cancel or signal."""

    name = "parked"
    search_attributes = ("region",)
    go = Signal(Go)

    async def run(self, ctx: SagaContext, job: Job) -> Done:
        got = await ctx.wait_signal(self.go)
        return Done(speed=got.speed)


def _settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str, rate: float) -> Settings:
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    return settings.model_copy(
        update={"batches": BatchSettings(rate_per_s=rate, poll_s=0.1, page_size=7)}
    )


async def _start(served: ServedWorker, n: int, region: str) -> list[str]:
    ids = []
    for _ in range(n):
        response = await served.http.post(
            "/sagas/parked", json={"region": region}, headers=OPERATOR
        )
        assert response.status_code == 202, response.text
        ids.append(response.json()["saga_id"])
    await eventually(lambda: _all_are(served, ids, "running"), timeout=30)
    return ids


async def _status_is(served: ServedWorker, saga_id: str, status: str) -> bool:
    response = await served.http.get(f"/sagas/{saga_id}", headers=OPERATOR)
    return response.status_code == 200 and response.json()["status"] == status


async def _all_are(served: ServedWorker, ids: list[str], status: str) -> bool:
    for saga_id in ids:
        if not await _status_is(served, saga_id, status):
            return False
    return True


async def _events(pg: PgTarget, kind: str) -> dict[str, list[dict[str, Any]]]:
    """Each saga's events of ``kind`` (their data), from the history table itself."""
    conn = await asyncpg.connect(pg.database_dsn, server_settings={"search_path": pg.schema})
    try:
        rows = await conn.fetch(
            "SELECT saga_id, data::text AS data FROM saga_events WHERE data->>'kind' = $1", kind
        )
    finally:
        await conn.close()
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["saga_id"], []).append(orjson.loads(r["data"]))
    return out


BASE = {"filter": {"saga_type": "parked", "attributes": {"region": "eu"}}}


async def test_an_operation_cancels_every_matching_saga_once_with_progress(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="saga_engine.admin.audit")
    settings = _settings(pg, kafka_bootstrap, unique_id, rate=40)
    async with served_worker(settings, [Parked]) as served:
        http = served.http
        ids = await _start(served, 40, "eu")
        others = await _start(served, 3, "us")
        body = {**BASE, "action": "cancel", "reason": "region closed"}

        dry = await http.post("/batch-operations", json={**body, "dry_run": True}, headers=OPERATOR)
        assert dry.status_code == 200, dry.text
        assert dry.json()["matched"] == 40
        assert set(dry.json()["sample"]) <= set(ids)
        assert (await http.get("/batch-operations", headers=OPERATOR)).json() == []

        created = await http.post("/batch-operations", json=body, headers=OPERATOR)
        assert created.status_code == 201, created.text
        op = created.json()
        assert (op["state"], op["total"], op["principal"]) == ("running", 40, "olivia")
        seen: list[int] = []

        async def finished() -> bool:
            now = (await http.get(f"/batch-operations/{op['id']}", headers=READER)).json()
            seen.append(now["done"])
            return bool(now["state"] == "completed")

        await eventually(finished, timeout=60, interval=0.05)
        # Rate-limited to 40/s: the progress was seen moving, not only at 0 and 40.
        assert any(0 < d < 40 for d in seen), seen
        assert seen == sorted(seen)
        done = (await http.get(f"/batch-operations/{op['id']}", headers=READER)).json()
        assert (done["acted"], done["skipped"], done["failed"], done["done"]) == (40, 0, 0, 40)
        assert done["finished_at"] is not None
        await eventually(lambda: _all_are(served, ids, "cancelled"), timeout=30)
        for saga_id in others:
            assert await _status_is(served, saga_id, "running")
        # One cancel per saga, naming the operation and its creator.
        cancels = await _events(pg, "cancel_requested")
        assert set(cancels) == set(ids)
        for saga_id in ids:
            [event] = cancels[saga_id]
            assert event["reason"] == f"[batch {op['id']}] region closed"
            assert event["principal"] == "olivia"
        # The saga's page names the operation in its history (the gist of the cancel).
        page = await http.get(f"/ui/sagas/{ids[0]}", headers=READER)
        assert f"[batch {op['id']}] region closed" in page.text
        listed = (await http.get("/batch-operations", headers=READER)).json()
        assert [o["id"] for o in listed] == [op["id"]]
        again = await http.post(f"/batch-operations/{op['id']}/cancel", headers=OPERATOR)
        assert again.status_code == 409, again.text
        assert any(
            op["id"] in r.getMessage() and "olivia" in r.getMessage()
            for r in caplog.records
            if r.name == "saga_engine.admin.audit"
        )


async def test_a_signal_to_many_and_an_operation_cancelled_midway(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(pg, kafka_bootstrap, unique_id, rate=5)
    async with served_worker(settings, [Parked]) as served:
        http = served.http
        ids = await _start(served, 30, "eu")
        body = {**BASE, "action": "signal", "signal": "go", "payload": {"speed": 7}}
        created = await http.post(
            "/batch-operations", json={**body, "reason": "go ahead"}, headers=OPERATOR
        )
        assert created.status_code == 201, created.text
        op_id = created.json()["id"]

        async def some_done() -> bool:
            got = (await http.get(f"/batch-operations/{op_id}", headers=OPERATOR)).json()
            return bool(got["done"] >= 3)

        await eventually(some_done, timeout=30, interval=0.05)
        # The page of a running operation: its progress, and a cancel button that works.
        page = await http.get(f"/ui/batch-operations/{op_id}", headers=OPERATOR)
        assert page.status_code == 200, page.text
        assert 'http-equiv="refresh"' in page.text
        assert f'action="/ui/batch-operations/{op_id}/cancel"' in page.text
        assert 'id="batch-state" class="state st-running"' in page.text
        posted = await http.post(f"/ui/batch-operations/{op_id}/cancel", headers=OPERATOR)
        assert posted.status_code == 303, posted.text
        stopped = await http.get(f"/batch-operations/{op_id}", headers=OPERATOR)
        assert stopped.json()["state"] == "cancelled"
        at_cancel = stopped.json()["done"]
        page = await http.get(f"/ui/batch-operations/{op_id}", headers=OPERATOR)
        assert 'http-equiv="refresh"' not in page.text
        assert "batch-cancel" not in page.text
        # Stopped: nothing more is acted on (the worker gives up at its next saga).
        await eventually(lambda: _count_completed(served, ids, at_least=at_cancel), timeout=30)
        signals = await _events(pg, "signal_received")
        assert at_cancel <= len(signals) <= at_cancel + 1
        assert len(signals) < 30
        for events in signals.values():
            [event] = events
            assert event["reason"] == f"[batch {op_id}] go ahead"
            assert event["payload"] == {"speed": 7}
        final = (await http.get(f"/batch-operations/{op_id}", headers=OPERATOR)).json()
        assert final["state"] == "cancelled"
        assert final["done"] <= at_cancel + 1


async def _reruns(pg: PgTarget) -> dict[str, list[dict[str, Any]]]:
    """Per original saga, the ``saga_started`` of the sagas re-running it (with their id)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for new_id, [started] in (await _events(pg, "saga_started")).items():
        if started.get("rerun_of"):
            found.setdefault(started["rerun_of"]["saga_id"], []).append({**started, "id": new_id})
    return found


async def test_a_rerun_operation_starts_one_linked_rerun_per_saga(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(pg, kafka_bootstrap, unique_id, rate=50)
    async with served_worker(settings, [Parked]) as served, SagaClient(settings) as client:
        http = served.http
        ids = await _start(served, 5, "eu")
        by_cli = await _start(served, 2, "us")
        by_client = await _start(served, 2, "asia")
        body = {**BASE, "action": "rerun", "reason": "replay the lost orders"}
        created = await http.post("/batch-operations", json=body, headers=OPERATOR)
        assert created.status_code == 201, created.text
        op_id = created.json()["id"]

        async def finished() -> bool:
            got = (await http.get(f"/batch-operations/{op_id}", headers=READER)).json()
            return bool(got["state"] == "completed")

        await eventually(finished, timeout=60, interval=0.05)
        done = (await http.get(f"/batch-operations/{op_id}", headers=READER)).json()
        # The reruns match the filter too (running, eu): passed over, not re-run.
        assert (done["acted"], done["skipped"], done["failed"], done["done"]) == (5, 0, 0, 5)
        reruns = await _reruns(pg)
        assert sorted(reruns) == sorted(ids)  # one each, none for the other regions
        for saga_id in ids:
            [started] = reruns[saga_id]
            assert started["rerun_of"]["principal"] == "olivia"
            assert started["rerun_of"]["reason"] == f"[batch {op_id}] replay the lost orders"
            assert started["input"] == {"region": "eu"}
            original = (await http.get(f"/sagas/{saga_id}", headers=READER)).json()
            assert original["status"] == "running"  # the original is left alone
            assert [r["saga_id"] for r in original["reruns"]] == [started["id"]]
            rerun = (await http.get(f"/sagas/{started['id']}", headers=READER)).json()
            assert rerun["rerun_of"]["saga_id"] == saga_id
        page = await http.get(f"/ui/batch-operations/{op_id}", headers=READER)
        assert '<dd id="batch-action">rerun</dd>' in page.text

        # The CLI and the client take the action too.
        ran = await cli(
            "batch",
            "start",
            "--action",
            "rerun",
            "--reason",
            "again",
            "--type",
            "parked",
            "--attr",
            "region=us",
            url=served.url,
        )
        assert ran.exit_code == 0, ran.output
        assert "rerun by olivia, completed, 2/2 (acted 2," in ran.stdout
        where = {"attributes": {"region": "asia"}}
        from_code = await client.start_batch(Parked, "rerun", reason="again", where=where)
        assert (await client.wait_batch(from_code, timeout=30))["acted"] == 2
        reruns = await _reruns(pg)
        assert sorted(reruns) == sorted(ids + by_cli + by_client)
        assert all(len(new) == 1 for new in reruns.values()), reruns


async def _count_completed(served: ServedWorker, ids: list[str], at_least: int) -> bool:
    n = 0
    for saga_id in ids:
        n += await _status_is(served, saga_id, "completed")
    return n >= at_least


async def test_bad_input_is_refused_and_nothing_is_recorded(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(pg, kafka_bootstrap, unique_id, rate=50)
    async with served_worker(settings, [Parked]) as served:
        http = served.http
        ok = {**BASE, "action": "cancel", "reason": "r"}
        for bad, where in [
            ({**ok, "action": "explode"}, ["body", "action"]),
            ({**ok, "action": "rerun", "payload": {"speed": 1}}, ["body", "signal"]),
            ({**ok, "reason": ""}, ["body", "reason"]),
            ({**ok, "reason": "   "}, ["body", "reason"]),
            ({**ok, "filter": {"saga_type": "nope"}}, ["body", "filter", "saga_type"]),
            (
                {**ok, "filter": {"attributes": {"colour": "red"}}},
                ["body", "filter", "attributes", "colour"],
            ),
            ({**ok, "filter": {"statuses": ["sleeping"]}}, ["body", "filter", "statuses", 0]),
            ({**ok, "filter": {"shape": "round"}}, ["body", "filter", "shape"]),
            (
                {
                    **ok,
                    "filter": {
                        "created_after": "2030-01-02T00:00:00Z",
                        "created_before": "2030-01-01T00:00:00Z",
                    },
                },
                ["body", "filter", "created_after"],
            ),
            ({**ok, "signal": "go"}, ["body", "signal"]),
            ({**ok, "action": "signal"}, ["body", "signal"]),
            ({**ok, "action": "signal", "signal": "stop"}, ["body", "signal"]),
            (
                {**ok, "action": "signal", "signal": "go", "payload": {"speed": "x"}},
                ["body", "payload", "speed"],
            ),
            (
                {**ok, "filter": {}, "action": "signal", "signal": "go"},
                ["body", "filter", "saga_type"],
            ),
        ]:
            refused = await http.post("/batch-operations", json=bad, headers=OPERATOR)
            assert refused.status_code == 422, (bad, refused.text)
            assert refused.json()["detail"][0]["loc"] == where, (bad, refused.text)
        assert (await http.post("/batch-operations", json=ok, headers=READER)).status_code == 403
        assert (await http.post("/batch-operations", json=ok)).status_code == 401
        assert (await http.get("/batch-operations")).status_code == 401
        assert (await http.get("/batch-operations/nope", headers=READER)).status_code == 404
        assert (
            await http.post("/batch-operations/nope/cancel", headers=OPERATOR)
        ).status_code == 404
        assert (await http.get("/batch-operations", headers=READER)).json() == []


async def cli(*args: str, url: str) -> Any:
    # The CLI is synchronous and the admin API is served on this test's loop: off-thread.
    return await asyncio.to_thread(
        invoke, [*args, "--admin-url", url], {"SAGA_ADMIN_TOKEN": OPERATOR_TOKEN}
    )


async def test_the_cli_starts_follows_lists_shows_and_cancels(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(pg, kafka_bootstrap, unique_id, rate=30)
    async with served_worker(settings, [Parked]) as served:
        ids = await _start(served, 12, "eu")
        where = ["--type", "parked", "--attr", "region=eu", "--status", "running"]
        dry = await cli(
            "batch",
            "start",
            "--action",
            "cancel",
            "--reason",
            "r",
            *where,
            "--dry-run",
            url=served.url,
        )
        assert dry.exit_code == 0, dry.output
        assert dry.stdout.strip() == "12 saga(s) match"
        started = await cli(
            "batch",
            "start",
            "--action",
            "signal",
            "--signal",
            "go",
            "--payload",
            '{"speed": 2}',
            "--reason",
            "ship them",
            *where,
            url=served.url,
        )
        assert started.exit_code == 0, started.output
        # The progress bar, then the operation as it ended.
        assert "12/12" in started.stdout
        last = started.stdout.strip().splitlines()[-1]
        assert "signal by olivia, completed, 12/12 (acted 12, skipped 0, failed 0)" in last
        op_id = last.split(":")[0]
        await eventually(lambda: _all_are(served, ids, "completed"), timeout=30)

        listed = as_json(await cli("batch", "list", "--json", url=served.url))
        assert [o["id"] for o in listed] == [op_id]
        shown = as_json(await cli("batch", "show", op_id, "--json", url=served.url))
        assert shown["acted"] == 12
        assert "1 operation(s)" in (await cli("batch", "list", url=served.url)).stdout
        ended = one_line_error(await cli("batch", "cancel", op_id, url=served.url), 4)
        assert "from completed to cancelled" in ended
        assert one_line_error(await cli("batch", "show", "nope", url=served.url), 3)
        # Cancelling completed sagas: each refused, counted, and listed on the page.
        refusing = await cli(
            "batch",
            "start",
            "--action",
            "cancel",
            "--reason",
            "too late",
            "--type",
            "parked",
            url=served.url,
        )
        assert "completed, 12/12 (acted 0, skipped 0, failed 12)" in refusing.stdout
        [newest, _] = as_json(await cli("batch", "list", "--json", url=served.url))
        listing = await served.http.get("/ui/batch-operations", headers=OPERATOR)
        assert f'href="/ui/batch-operations/{op_id}"' in listing.text
        assert f'href="/ui/batch-operations/{newest["id"]}"' in listing.text
        detail = await served.http.get(f"/ui/batch-operations/{newest['id']}", headers=OPERATOR)
        assert detail.text.count('class="saga-link"') == 12
        for saga_id in ids:
            assert f'href="/ui/sagas/{saga_id}"' in detail.text
        missing = await served.http.get("/ui/batch-operations/nope", headers=OPERATOR)
        assert missing.status_code == 404
        refused = one_line_error(
            await cli(
                "batch",
                "start",
                "--action",
                "signal",
                "--signal",
                "stop",
                "--reason",
                "r",
                *where,
                url=served.url,
            ),
            5,
        )
        assert "declares no signal 'stop'" in refused


async def test_the_client_starts_waits_for_and_cancels_operations(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(pg, kafka_bootstrap, unique_id, rate=50)
    async with served_worker(settings, [Parked]) as served, SagaClient(settings) as client:
        ids = await _start(served, 6, "eu")
        await _start(served, 2, "us")
        where = {"statuses": ["running"], "attributes": {"region": "eu"}}
        assert await client.count_batch(Parked, where) == 6
        op_id = await client.start_batch(
            Parked,
            "signal",
            signal="go",
            payload=Go(speed=9),
            reason="from code",
            where=where,
            principal="batch-bot",
        )
        done = await client.wait_batch(op_id, timeout=30)
        assert (done["state"], done["acted"], done["principal"]) == ("completed", 6, "batch-bot")
        assert await _all_are(served, ids, "completed")
        assert (await client.batch(op_id))["id"] == op_id
        with pytest.raises(InvalidTransition):
            await client.cancel_batch(op_id)
        # Bad input: the field named, nothing recorded.
        with pytest.raises(InvalidPayload) as bad:
            await client.start_batch(Parked, "signal", signal="stop", reason="x")
        assert bad.value.errors[0]["loc"] == ["signal"]
        with pytest.raises(InvalidPayload) as bad:
            await client.start_batch(Parked, "explode", reason="x")
        assert bad.value.errors[0]["loc"] == ["action"]
        with pytest.raises(InvalidPayload) as bad:
            await client.start_batch(Parked, "cancel", reason=" ")
        assert bad.value.errors[0]["loc"] == ["reason"]
        listed = (await served.http.get("/batch-operations", headers=READER)).json()
        assert [o["id"] for o in listed] == [op_id]
        # One that matches nothing completes at once.
        empty = await client.start_batch(Parked, "cancel", reason="stop", where={"q": "zzz"})
        stopped = await client.wait_batch(empty, timeout=30)
        assert (stopped["state"], stopped["total"], stopped["done"]) == ("completed", 0, 0)

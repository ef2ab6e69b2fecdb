"""docs/operations.md "Schedules" works as written: its saga and schedule run in a real
worker, its JSON body is accepted by the admin API, and each of its `saga schedule`
commands succeeds against that worker (on the real Postgres and Kafka)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from tests.cli.conftest import invoke
from tests.conftest import PgTarget
from tests.doc_blocks import ROOT, code_blocks, exec_blocks, shell_commands
from tests.served_worker import OPERATOR_TOKEN, real_settings, served_worker
from tests.waiting import eventually

pytestmark = pytest.mark.integration

OPERATIONS = ROOT / "docs" / "operations.md"
SECTION = "## Schedules"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def test_the_section_has_the_three_ways_in() -> None:
    langs = [b.lang for b in code_blocks(OPERATIONS, under=SECTION)]
    assert langs == ["python", "json", "sh"]


async def test_the_schedules_example_runs(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    [python] = code_blocks(OPERATIONS, "python", under=SECTION)
    [body] = code_blocks(OPERATIONS, "json", under=SECTION)
    [shell] = code_blocks(OPERATIONS, "sh", under=SECTION)
    namespace: dict[str, Any] = {"__name__": "myapp.reconcile"}
    exec_blocks([python], OPERATIONS, namespace)
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with served_worker(
        settings, [namespace["Reconcile"]], schedules=[namespace["NIGHTLY"]]
    ) as served:
        http = served.http
        # Declared in code: created at the worker's start.
        nightly = (await http.get("/schedules/nightly-reconcile", headers=OPERATOR)).json()
        assert nightly["spec"] == "cron 0 3 * * * (Europe/Paris)"
        assert nightly["origin"] == "code"
        # The API's body.
        created = await http.post("/schedules", json=orjson.loads(body.code), headers=OPERATOR)
        assert created.status_code == 201, created.text
        # Each CLI command, in order, against this worker.
        triggered = ""
        for command in shell_commands(shell):
            assert command[0] == "saga"
            result = await asyncio.to_thread(
                invoke,
                [*command[1:], "--admin-url", served.url],
                {"SAGA_ADMIN_TOKEN": OPERATOR_TOKEN},
            )
            assert result.exit_code == 0, (command, result.output)
            if command[1:3] == ["schedule", "trigger"]:
                triggered = result.stdout.strip()
        listed = {s["id"] for s in (await http.get("/schedules", headers=OPERATOR)).json()}
        assert listed == {"nightly-reconcile", "every-5-minutes"}  # hourly-eu was deleted

        async def completed() -> bool:
            answer = await http.get(f"/sagas/{triggered}", headers=OPERATOR)
            return answer.status_code == 200 and answer.json()["status"] == "completed"

        await eventually(completed, timeout=30)

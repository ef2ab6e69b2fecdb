"""docs/batch-operations.md works as written: its saga runs in a real worker (the real
Postgres and Kafka), its dry-run body is accepted by the admin API and counts the sagas,
the same body without ``dry_run`` releases them, and each of its ``saga batch`` commands
succeeds against that worker, cancelling the Berlin shipments and re-running them."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from saga_engine.client import SagaClient
from saga_engine.settings import BatchSettings
from tests.cli.conftest import invoke
from tests.conftest import PgTarget
from tests.doc_blocks import ROOT, code_blocks, exec_blocks, shell_commands
from tests.served_worker import OPERATOR_TOKEN, ServedWorker, real_settings, served_worker
from tests.waiting import eventually

pytestmark = pytest.mark.integration

DOC = ROOT / "docs" / "batch-operations.md"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def test_the_document_has_the_three_ways_in() -> None:
    assert [b.lang for b in code_blocks(DOC)] == ["python", "json", "sh", "python"]


async def _statuses(served: ServedWorker, ids: list[str]) -> list[str]:
    out = []
    for saga_id in ids:
        answer = await served.http.get(f"/sagas/{saga_id}", headers=OPERATOR)
        out.append(answer.json()["status"] if answer.status_code == 200 else "")
    return out


async def test_the_batch_operations_example_runs(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    [python, from_code] = code_blocks(DOC, "python")
    [body] = code_blocks(DOC, "json")
    [shell] = code_blocks(DOC, "sh")
    namespace: dict[str, Any] = {"__name__": "myapp.shipping"}
    exec_blocks([python], DOC, namespace)
    settings = real_settings(pg, kafka_bootstrap, unique_id).model_copy(
        update={"batches": BatchSettings(poll_s=0.1)}
    )
    async with served_worker(settings, [namespace["Shipment"]]) as served:
        http = served.http
        ids: dict[str, list[str]] = {"ams-1": [], "ber-2": []}
        for warehouse, sagas in ids.items():
            for i in range(4):
                started = await http.post(
                    "/sagas/shipment",
                    json={"order_id": f"{warehouse}-{i}", "warehouse": warehouse},
                    headers=OPERATOR,
                )
                assert started.status_code == 202, started.text
                sagas.append(started.json()["saga_id"])
        everyone = ids["ams-1"] + ids["ber-2"]
        await eventually(lambda: _all(served, everyone, "running"), timeout=30)

        # The dry run counts; the same body without dry_run releases them.
        request = orjson.loads(body.code)
        dry = await http.post("/batch-operations", json=request, headers=OPERATOR)
        assert dry.status_code == 200, dry.text
        assert dry.json()["matched"] == 4
        real = await http.post(
            "/batch-operations", json={**request, "dry_run": False}, headers=OPERATOR
        )
        assert real.status_code == 201, real.text
        await eventually(lambda: _all(served, ids["ams-1"], "completed"), timeout=30)
        shipped = await http.get(f"/sagas/{ids['ams-1'][0]}", headers=OPERATOR)
        assert shipped.json()["output"] == {"gate": 4}

        # Each CLI command, in order, against this worker.
        outputs = []
        for command in shell_commands(shell):
            assert command[0] == "saga"
            result = await asyncio.to_thread(
                invoke,
                [*command[1:], "--admin-url", served.url],
                {"SAGA_ADMIN_TOKEN": OPERATOR_TOKEN},
            )
            assert result.exit_code == 0, (command, result.output)
            outputs.append(result.stdout)
        assert outputs[0].strip() == "0 saga(s) match"  # released already
        assert "cancel by olivia, completed, 4/4 (acted 4" in outputs[1]
        assert "2 operation(s)" in outputs[2]
        assert await _statuses(served, ids["ber-2"]) == ["cancelled"] * 4
        assert "rerun by olivia, completed, 4/4 (acted 4" in outputs[3]
        reruns = []
        for saga_id in ids["ber-2"]:
            original = (await http.get(f"/sagas/{saga_id}", headers=OPERATOR)).json()
            [rerun] = original["reruns"]
            reruns.append(rerun["saga_id"])
        await eventually(lambda: _all(served, reruns, "running"), timeout=30)

        # From code: two more Berlin shipments, cancelled by the client's operation.
        more = []
        for i in range(2):
            started = await http.post(
                "/sagas/shipment",
                json={"order_id": f"late-{i}", "warehouse": "ber-2"},
                headers=OPERATOR,
            )
            more.append(started.json()["saga_id"])
        await eventually(lambda: _all(served, more, "running"), timeout=30)
        exec_blocks([from_code], DOC, namespace)
        async with SagaClient(settings) as client:
            ended = await namespace["close_berlin"](client)
        # The two late ones, and the four reruns (running again in Berlin).
        assert (ended["state"], ended["acted"], ended["principal"]) == ("completed", 6, "ops-bot")
        assert await _statuses(served, more + reruns) == ["cancelled"] * 6


async def _all(served: ServedWorker, ids: list[str], status: str) -> bool:
    return await _statuses(served, ids) == [status] * len(ids)

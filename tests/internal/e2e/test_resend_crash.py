"""An operator's re-send on the real stack, through a real engine's admin API: the
participant is down when the command is sent; the operator re-sends it (recorded in the
history), the engine is SIGKILLed, a new engine recovers the saga and its participant
comes up: it receives every copy and applies the command once, in its own table."""

from __future__ import annotations

import httpx
import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from tests.internal.e2e.harness import Cluster
from tests.internal.e2e.resend_app import Charge, Resent
from tests.internal.e2e.test_updates_crash import _admin_url, _charges
from tests.waiting import eventually

pytestmark = pytest.mark.integration

APP = "tests.internal.e2e.resend_app:SAGAS"


def _start_engine(cluster: Cluster) -> None:
    cluster._spawn(
        "engine", ["-m", "saga_engine", "worker", APP, "--log-level", "INFO"], cluster.env()
    )


async def test_a_re_send_survives_a_sigkill_and_is_applied_once(cluster: Cluster) -> None:
    _start_engine(cluster)  # alpha is down: the command waits in its topic
    url = await _admin_url(cluster, 0)
    async with SagaClient(cluster.settings) as client:
        saga_id = await client.start(Resent, Charge(amount=42))
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:

            async def actions() -> dict[str, list[str]]:
                detail = (await http.get(f"/sagas/{saga_id}")).json()
                return {a["name"]: a["steps"] for a in detail.get("actions", [])}

            await eventually(
                actions,
                until=lambda offered: offered.get("retry") == ["charge"],
                timeout=60,
                interval=0.1,
                what="a retry of charge offered",
            )
            resent = await http.post(
                f"/sagas/{saga_id}/retry", json={"step": "charge", "reason": "alpha was down"}
            )
            assert resent.status_code == 200, resent.text

        cluster.kill("engine")
        _start_engine(cluster)
        cluster.start_participant("alpha")
        statuses = await cluster.wait_settled([saga_id], timeout=90)
        assert statuses[saga_id] == SagaStatus.COMPLETED, cluster.log_tail("engine")
    async with httpx.AsyncClient(base_url=await _admin_url(cluster, 1), timeout=30) as http:
        history = (await http.get(f"/sagas/{saga_id}/history")).json()["events"]
    retries = [e for e in history if e["kind"] == "retry_requested"]
    assert [(e["step"], e["reason"]) for e in retries] == [("charge", "alpha was down")]
    issued = [e for e in history if e["kind"] == "command_issued"]
    assert len(issued) == 1  # one command, sent under one id however many times
    assert await _charges(cluster, saga_id) == [("apply", 42)]

"""One saga's command too large for the broker (issue 39, 8.1): its step fails before
the command is recorded, naming the limit, and every other saga of the engine goes on.

The worker and the participants are real processes on the real broker. What is measured
is not a time: the small sagas started right after the oversized one all complete (a
stalled inbox completes none of them, however long the deadline), and the worker never
retried a batch as transiently failing.
"""

from __future__ import annotations

import os
import signal

import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from tests.internal.e2e.app import Transfer, TransferRequest
from tests.internal.e2e.harness import Cluster
from tests.internal.e2e.size_app import Bulky, BulkyRequest, Lost
from tests.waiting import eventually

pytestmark = pytest.mark.integration

SMALL = 20


def start_worker(cluster: Cluster, name: str = "engine") -> None:
    cluster._spawn(
        name,
        ["-m", "saga_engine", "worker", "tests.internal.e2e.size_app:SAGAS", "--log-level", "INFO"],
        cluster.env(),
    )


@pytest.mark.timeout(300)
async def test_an_oversized_command_fails_its_step_and_stalls_no_other_saga(
    participants_up: Cluster,
) -> None:
    cluster = participants_up
    start_worker(cluster)
    limit = cluster.settings.kafka.max_message_bytes
    async with SagaClient(cluster.settings) as client:
        bulky = await client.start(Bulky, BulkyRequest(size=int(limit * 1.2)))
        # The oversized saga's first step is answered (its reply shares the inbox with the
        # small sagas' starts) before they are started.
        await cluster.wait_commands("alpha", [bulky])
        small = [await client.start(Transfer, TransferRequest(amount=i)) for i in range(SMALL)]
    statuses = await cluster.wait_settled([bulky, *small], timeout=180)
    assert {statuses[s] for s in small} == {SagaStatus.COMPLETED}
    assert statuses[bulky] == SagaStatus.COMPENSATED

    rows = await cluster.query(
        "SELECT kind FROM saga_events WHERE saga_id = $1 ORDER BY seq", bulky
    )
    kinds = [r["kind"] for r in rows]
    # The oversized command was never recorded (nor sent): only the first step's was.
    assert kinds.count("command_issued") == 1, kinds
    view = await cluster.query("SELECT error FROM sagas WHERE saga_id = $1", bulky)
    error = str(view[0]["error"])
    assert "apply-beta" in error, error
    assert f"{limit:,}" in error, error
    assert "SAGA_KAFKA__MAX_MESSAGE_BYTES" in error, error

    log = (cluster.logs / "engine.log").read_text(errors="replace")
    assert "transient failure" not in log
    assert "MessageSizeTooLarge" not in log


async def _log_shows(cluster: Cluster, text: str, times: int, timeout: float) -> None:
    log = cluster.logs / "engine.log"
    await eventually(
        lambda: log.exists() and log.read_text(errors="replace").count(text) >= times,
        timeout=timeout,
        what=f"{text!r} x{times} in the engine's log",
    )


@pytest.mark.timeout(300)
async def test_a_worker_exits_on_sigterm_while_a_send_keeps_failing(
    participants_up: Cluster,
) -> None:
    """A step to a participant whose topic cannot exist: every send fails, as far as the
    engine can tell transiently, and is retried (by the inbox, by the step's timeout and
    the wake-up poll). A SIGTERM still stops the worker."""
    cluster = participants_up
    start_worker(cluster)
    async with SagaClient(cluster.settings) as client:
        await client.start(Lost, BulkyRequest(size=1))
    # Retried, past the step's 1 s timeout.
    await _log_shows(cluster, "could not create topic", times=3, timeout=120)
    os.killpg(cluster.procs["engine"].pid, signal.SIGTERM)
    # Generous: a stop waits for the inbox's batch at most 30 s, then cancels it.
    code = await cluster.wait_exit("engine", timeout=60)
    assert code == 0, cluster.log_tail("engine")

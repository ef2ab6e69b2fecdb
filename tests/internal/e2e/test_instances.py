"""Several engine instances share the sagas through the consumer group."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from tests.internal.e2e.app import Transfer, TransferRequest
from tests.internal.e2e.harness import Cluster
from tests.waiting import eventually

pytestmark = pytest.mark.integration


async def _start(cluster: Cluster, count: int, pause_s: float) -> list[str]:
    async with SagaClient(cluster.settings) as client:
        return [
            await client.start(Transfer, TransferRequest(amount=i, pause_s=pause_s))
            for i in range(count)
        ]


async def _running_somewhere(cluster: Cluster, ids: list[str]) -> bool:
    """Every saga exists, and some are under way (they sleep between steps)."""
    statuses = await cluster.statuses(ids)
    return len(statuses) == len(ids) and any(s == SagaStatus.RUNNING for s in statuses.values())


def _logs(cluster: Cluster, *engines: str) -> Callable[[], str]:
    return lambda: "\n".join(f"--- {e}:\n{cluster.log_tail(e, 40)}" for e in engines)


async def test_survivor_takes_over_the_sagas_of_a_killed_instance(participants_up: Cluster) -> None:
    cluster = participants_up
    cluster.start_engine("engine-a")
    cluster.start_engine("engine-b")
    # Both must own partitions before the sagas start, so each drives some of them.
    await cluster.wait_partitions_taken("engine-a", "engine-b")
    ids = await _start(cluster, 16, pause_s=1.5)
    # Wait until every saga exists and is under way, then kill one engine while it
    # drives some of them.
    await eventually(
        lambda: _running_somewhere(cluster, ids),
        interval=0.1,
        what="every saga to exist and some to run",
        context=_logs(cluster, "engine-a", "engine-b"),
    )
    cluster.kill("engine-a")
    statuses = await cluster.wait_settled(ids, timeout=120)
    assert set(statuses.values()) == {SagaStatus.COMPLETED}
    await cluster.check_effects(statuses, {})
    # The survivor really took over open sagas of the killed instance.
    recovered = [
        int(n) for n in re.findall(r"and recovered (\d+) sagas", cluster.log_tail("engine-b", 500))
    ]
    assert any(n > 0 for n in recovered), cluster.log_tail("engine-b", 50)


async def test_a_new_instance_mid_run_rebalances_without_duplicates(
    participants_up: Cluster,
) -> None:
    cluster = participants_up
    cluster.start_engine("engine-a")
    # Long pauses, so that the sagas are still under way when engine-b (a process starting
    # on a busy machine) joins.
    ids = await _start(cluster, 16, pause_s=3.0)
    # engine-b must join mid-run, while sagas are under way.
    await eventually(
        lambda: _running_somewhere(cluster, ids),
        interval=0.1,
        what="every saga to exist and some to run",
        context=_logs(cluster, "engine-a"),
    )
    cluster.start_engine("engine-b")
    await cluster.wait_partitions_taken("engine-b")
    statuses = await cluster.wait_settled(ids, timeout=120)
    assert set(statuses.values()) == {SagaStatus.COMPLETED}
    await cluster.check_effects(statuses, {})

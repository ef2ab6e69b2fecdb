"""Several engine instances share the sagas through the consumer group."""

from __future__ import annotations

import asyncio
import re

import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from tests.e2e.app import Transfer, TransferRequest
from tests.e2e.harness import Cluster

pytestmark = pytest.mark.integration


async def _start(cluster: Cluster, count: int, pause_s: float) -> list[str]:
    async with SagaClient(cluster.settings) as client:
        return [
            await client.start(Transfer, TransferRequest(amount=i, pause_s=pause_s))
            for i in range(count)
        ]


async def _running_somewhere(cluster: Cluster, ids: list[str]) -> bool:
    statuses = await cluster.statuses(ids)
    return len(statuses) == len(ids) and any(s == SagaStatus.RUNNING for s in statuses.values())


async def test_survivor_takes_over_the_sagas_of_a_killed_instance(participants_up: Cluster) -> None:
    cluster = participants_up
    cluster.start_engine("engine-a")
    cluster.start_engine("engine-b")
    # Both must own partitions before the sagas start, so each drives some of them.
    for _ in range(300):
        logs = cluster.log_tail("engine-a", 200) + cluster.log_tail("engine-b", 200)
        if logs.count("took partitions") >= 2:
            break
        await asyncio.sleep(0.1)
    ids = await _start(cluster, 16, pause_s=1.5)
    # Wait until every saga exists and is under way (they sleep between steps), then
    # kill one engine while it drives some of them.
    for _ in range(300):
        statuses = await cluster.statuses(ids)
        if len(statuses) == len(ids) and await _running_somewhere(cluster, ids):
            break
        await asyncio.sleep(0.1)
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
    ids = await _start(cluster, 16, pause_s=1.0)
    for _ in range(200):
        if await _running_somewhere(cluster, ids):
            break
        await asyncio.sleep(0.1)
    cluster.start_engine("engine-b")
    statuses = await cluster.wait_settled(ids, timeout=120)
    assert set(statuses.values()) == {SagaStatus.COMPLETED}
    await cluster.check_effects(statuses, {})
    assert "took partitions" in cluster.log_tail("engine-b", 200)

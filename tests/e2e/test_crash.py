"""Crash tests: SIGKILL real engine and participant processes at deterministic points.

Each scenario starts real processes (an engine, three ledger participants) on the real
Kafka and Postgres, kills one at a chosen crash point, restarts it, and then checks,
in the participants' own tables, that every saga ended and no effect was applied twice.
"""

from __future__ import annotations

import random
import signal

import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from tests.e2e.app import PARTICIPANTS, Transfer, TransferRequest
from tests.e2e.harness import Cluster

pytestmark = pytest.mark.integration

SEEDS = [11, 23]


async def _start_sagas(
    cluster: Cluster, seed: int, count: int = 6
) -> tuple[list[str], dict[str, str]]:
    rng = random.Random(seed)
    ids: list[str] = []
    failing: dict[str, str] = {}
    async with SagaClient(cluster.settings) as client:
        for i in range(count):
            # Every other saga is refused at a random later step, so it compensates.
            fail_at = rng.choice(PARTICIPANTS[1:]) if i % 2 else None
            saga_id = await client.start(
                Transfer,
                TransferRequest(amount=10 + i, fail_at=fail_at),
                idempotency_key=f"{seed}-{i}",
            )
            ids.append(saga_id)
            if fail_at:
                failing[saga_id] = fail_at
    return ids, failing


def _expected(ids: list[str], failing: dict[str, str]) -> dict[str, SagaStatus]:
    return {i: SagaStatus.COMPENSATED if i in failing else SagaStatus.COMPLETED for i in ids}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "point",
    [
        "before_send",  # the command-issued event is committed; the command is not produced
        "after_send",  # the command is produced
        "before_offset_commit",  # a reply's events are committed; the offset is not
        "before_send_compensation",  # in the middle of compensating
    ],
)
async def test_engine_killed_at_a_crash_point_recovers(
    participants_up: Cluster, point: str, seed: int
) -> None:
    cluster = participants_up
    hit = 1 + seed % 3
    cluster.start_engine("engine", crash_at=f"{point}:{hit}")
    ids, failing = await _start_sagas(cluster, seed)
    code = await cluster.wait_exit("engine")
    assert code == -signal.SIGKILL, cluster.log_tail("engine")
    assert f"crash point {point} reached" in cluster.log_tail("engine")

    cluster.start_engine("engine")
    statuses = await cluster.wait_settled(ids)
    assert statuses == _expected(ids, failing)
    await cluster.check_effects(statuses, failing)


@pytest.mark.parametrize("seed", SEEDS)
async def test_participant_killed_after_commit_before_reply_recovers(
    cluster: Cluster, seed: int
) -> None:
    # The first commit: commands are taken in batches, so how many commits six sagas
    # make depends on timing (at least one).
    for name in PARTICIPANTS:
        cluster.start_participant(name, crash_at="after_commit:1" if name == "beta" else None)
    cluster.start_engine("engine")
    ids, failing = await _start_sagas(cluster, seed)
    code = await cluster.wait_exit("participant-beta")
    assert code == -signal.SIGKILL
    cluster.start_participant("beta")
    statuses = await cluster.wait_settled(ids)
    assert statuses == _expected(ids, failing)
    await cluster.check_effects(statuses, failing)

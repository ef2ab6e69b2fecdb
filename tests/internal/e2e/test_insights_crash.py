"""Insights with real engine processes: SIGKILL the engine at a crash point, restart it,
and once every saga has ended the aggregates count each run exactly once (recorded in the
transaction of its terminal event and added by a roll-up that takes it off that record
in its own, so neither a lost nor a replayed append can count it twice or not at all):
outcomes, the runs that took each step, the compensations."""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from saga_engine import SagaStatus
from tests.internal.e2e.app import PARTICIPANTS
from tests.internal.e2e.harness import Cluster
from tests.internal.e2e.test_crash import _expected, _start_sagas
from tests.waiting import eventually

pytestmark = pytest.mark.integration


async def _aggregates(cluster: Cluster) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """Outcomes, runs per node and compensations per node of the transfers, as stored."""
    rows = await cluster.query(
        "SELECT facet, key, sum(runs) AS runs, sum(compensations) AS comps FROM saga_insights "
        "WHERE saga_type = 'transfer' AND facet IN ('type', 'node') GROUP BY facet, key"
    )
    outcomes = Counter({r["key"]: int(r["runs"]) for r in rows if r["facet"] == "type"})
    nodes = Counter({r["key"]: int(r["runs"]) for r in rows if r["facet"] == "node"})
    comps = Counter({r["key"]: int(r["comps"]) for r in rows if r["facet"] == "node"})
    return outcomes, +nodes, +comps


@pytest.mark.parametrize("point", ["after_append:9", "before_offset_commit:5"])
async def test_each_run_counts_once_across_an_engine_crash(
    participants_up: Cluster, point: str
) -> None:
    cluster = participants_up
    cluster.start_engine("engine", crash_at=point)
    ids, failing = await _start_sagas(cluster, 7, count=8)
    assert await cluster.wait_exit("engine") == -signal.SIGKILL, cluster.log_tail("engine")
    cluster.start_engine("engine")
    statuses = await cluster.wait_settled(ids)
    assert statuses == _expected(ids, failing)

    # The engine's housekeeping rolls the ended runs up every 2 s: wait until it has
    # taken every one off the record, then count.
    async def pending() -> int:
        rows = await cluster.query("SELECT count(*) AS n FROM saga_insights_ended")
        return int(rows[0]["n"])

    await eventually(
        pending,
        until=lambda n: n == 0,
        interval=0.2,
        what="the roll-up to take every ended run off the record",
        context=lambda: cluster.log_tail("engine"),
    )
    outcomes, nodes, comps = await _aggregates(cluster)
    assert outcomes == Counter(s.value for s in statuses.values())
    # A saga took each step up to the one refused (included).
    took: Counter[str] = Counter()
    for saga_id in ids:
        for participant in PARTICIPANTS:
            took[f"apply-{participant}"] += 1
            if failing.get(saga_id) == participant:
                break
    assert nodes == took
    # Each compensated saga undid every step before the refused one.
    undone: Counter[str] = Counter()
    for saga_id, status in statuses.items():
        if status is SagaStatus.COMPENSATED:
            for participant in PARTICIPANTS[: PARTICIPANTS.index(failing[saga_id])]:
                undone[f"apply-{participant}"] += 1
    assert comps == undone

"""A SIGKILL of the engine process during a rollout: sagas of both versions in flight,
kill -9, restart, and every saga finishes on the version it started with. The
participants' ledgers (their own tables, no uniqueness on the command id) tell which
class drove each saga and that no effect was applied twice."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import asyncpg
import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from saga_engine.core.planning._rollout import RolloutSpec, bucket
from saga_engine.store._migrations import migrate
from saga_engine.store._pgstore import PostgresEventStore
from tests.internal.e2e.app import PARTICIPANTS
from tests.internal.e2e.harness import Cluster
from tests.internal.versions.app import TYPE, Request
from tests.waiting import eventually

pytestmark = pytest.mark.integration

PERCENT = 50
COUNT = 16


def start_engine(cluster: Cluster) -> None:
    cluster._spawn(
        "engine",
        ["-m", "saga_engine", "worker", "tests.internal.versions.app", "--log-level", "INFO"],
        cluster.env(),
    )


async def _versions(cluster: Cluster, ids: list[str]) -> dict[str, int]:
    conn = await asyncpg.connect(cluster.database_dsn)
    try:
        rows = await conn.fetch(
            f'SELECT saga_id, saga_version FROM "{cluster.schema}".sagas WHERE saga_id = ANY($1)',
            ids,
        )
    except asyncpg.UndefinedTableError:
        return {}
    finally:
        await conn.close()
    return {r["saga_id"]: r["saga_version"] for r in rows}


async def test_engine_killed_during_a_rollout_finishes_each_saga_on_its_version(
    participants_up: Cluster,
) -> None:
    cluster = participants_up
    await migrate(cluster.database_dsn, cluster.schema)
    store = await PostgresEventStore.connect(cluster.settings.pg)
    try:
        await store.set_rollout(
            TYPE,
            RolloutSpec(version=2, percent=PERCENT),
            principal="test",
            reason="half",
            at=datetime.now(UTC),
        )
    finally:
        await store.close()
    start_engine(cluster)
    ids = [f"vt-{i}" for i in range(COUNT)]
    expected = {i: 2 if bucket(TYPE, i) < PERCENT else 1 for i in ids}
    assert set(expected.values()) == {1, 2}  # both versions are in the run
    async with SagaClient(cluster.settings) as client:
        for i, saga_id in enumerate(ids):
            await client.start(TYPE, Request(amount=10 + i, pause_s=1.5), saga_id=saga_id)

    # In flight on both versions: every saga started (its version recorded) and its first
    # step applied at alpha, none finished yet (the durable sleeps keep them going).
    async def in_flight() -> bool:
        versions = await _versions(cluster, ids)
        applied = {r["saga_id"] for r in await cluster.ledger("alpha")}
        return len(versions) == COUNT and applied >= set(ids)

    await eventually(in_flight, timeout=60, interval=0.1)
    statuses = await cluster.statuses(ids)
    running = {expected[i] for i, s in statuses.items() if s is SagaStatus.RUNNING}
    assert running == {1, 2}, statuses  # sagas of both versions are in flight

    cluster.kill("engine")  # SIGKILL
    start_engine(cluster)
    settled = await cluster.wait_settled(ids, timeout=120)
    assert set(settled.values()) == {SagaStatus.COMPLETED}, settled
    assert await _versions(cluster, ids) == expected

    ledgers = {p: await cluster.ledger(p) for p in PARTICIPANTS}
    for participant, rows in ledgers.items():
        per_command = Counter(r["command_id"] for r in rows)
        assert all(n == 1 for n in per_command.values()), f"{participant}: duplicated effects"
    for saga_id, version in expected.items():
        kinds = {
            p: sorted(r["kind"] for r in ledgers[p] if r["saga_id"] == saga_id)
            for p in PARTICIPANTS
        }
        # v1 applies at alpha and beta; v2 at gamma too: the class it started with.
        want = {"alpha": ["apply"], "beta": ["apply"], "gamma": ["apply"] if version == 2 else []}
        assert kinds == want, (saga_id, version, kinds)

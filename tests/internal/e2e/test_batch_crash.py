"""A batch operation with real engine processes: SIGKILL the engine between an action on
a saga and the operation's progress recording it (crash point ``batch_after_action``);
a restarted engine takes the operation over once the lease has expired, finishes it, and
no saga was acted on twice: one cancel in each saga's history, and in the participants'
own tables one apply and one revert per saga. A rerun operation SIGKILLed the same way
starts one rerun per saga, never two."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime

import asyncpg
import pytest
from pydantic import SecretStr

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from saga_engine.core.planning._batch_operations import (
    BatchAction,
    BatchFilter,
    BatchSpec,
    BatchState,
    reason_prefix,
)
from saga_engine.kernel._settings import PostgresSettings
from saga_engine.store._pgbatch_operations import PostgresBatchStore
from tests.internal.e2e.app import Transfer, TransferRequest
from tests.internal.e2e.harness import Cluster
from tests.waiting import eventually

pytestmark = pytest.mark.integration

APP = ["-m", "saga_engine", "worker", "tests.internal.e2e.app", "--log-level", "INFO"]
SAGAS = 12
#: The engine dies at the 4th action: 3 recorded, the 4th durable but not recorded.
CRASH_AT = 4
BATCHES = {
    "SAGA_BATCHES__LEASE_S": "2",
    "SAGA_BATCHES__POLL_S": "0.2",
    "SAGA_BATCHES__RATE_PER_S": "20",
    "SAGA_BATCHES__PAGE_SIZE": "5",
}


async def _cancels(cluster: Cluster, op_id: str) -> Counter[str]:
    """The cancels in each saga's history (every one carrying the operation's id)."""
    conn = await asyncpg.connect(
        cluster.database_dsn, server_settings={"search_path": cluster.schema}
    )
    try:
        rows = await conn.fetch(
            "SELECT saga_id, data->>'reason' AS reason FROM saga_events "
            "WHERE data->>'kind' = 'cancel_requested'"
        )
    finally:
        await conn.close()
    assert all(r["reason"] == f"{reason_prefix(op_id)} the whole batch is void" for r in rows)
    return Counter(r["saga_id"] for r in rows)


async def _applied_transfers(cluster: Cluster, count: int) -> list[str]:
    """Transfers that applied their first step and sleep (an hour) before the next."""
    async with SagaClient(cluster.settings) as client:
        ids = [
            await client.start(Transfer, TransferRequest(amount=1 + i, pause_s=3600))
            for i in range(count)
        ]

    async def alpha_applied() -> bool:
        rows = await cluster.ledger("alpha")
        return {r["saga_id"] for r in rows if r["kind"] == "apply"} == set(ids)

    await eventually(alpha_applied, timeout=90, interval=0.2)
    return ids


async def _cancel_all(cluster: Cluster, total: int) -> tuple[PostgresBatchStore, str]:
    """A store on the cluster's schema and the operation that cancels every transfer.
    No status filter: a saga cancelled just before a crash still matches when it is read
    again, so its history is what keeps it from a second cancel."""
    pg = PostgresSettings(dsn=SecretStr(cluster.database_dsn), db_schema=cluster.schema)
    store = await PostgresBatchStore.connect(pg)
    op_id = str(uuid.uuid4())
    spec = BatchSpec(
        filter=BatchFilter(saga_type="transfer"),
        action=BatchAction.CANCEL,
        reason="the whole batch is void",
    )
    await store.create(op_id, spec, "olivia", total, datetime.now(UTC))
    return store, op_id


async def test_sigkill_between_an_action_and_its_progress_acts_on_each_saga_once(
    participants_up: Cluster,
) -> None:
    cluster = participants_up
    cluster._spawn(
        "engine", APP, cluster.env(SAGA_CRASH_AT=f"batch_after_action:{CRASH_AT}", **BATCHES)
    )
    ids = await _applied_transfers(cluster, SAGAS)
    store, op_id = await _cancel_all(cluster, SAGAS)
    try:
        assert await cluster.wait_exit("engine") == -9, cluster.log_tail("engine")
        assert "crash point batch_after_action reached" in cluster.log_tail("engine")
        crashed = await store.get(op_id)
        assert (crashed.state, crashed.done) == (BatchState.RUNNING, CRASH_AT - 1)
        assert sum((await _cancels(cluster, op_id)).values()) == CRASH_AT

        cluster._spawn("engine", APP, cluster.env(**BATCHES))
        done = await eventually(
            lambda: store.get(op_id),
            until=lambda op: op.state is BatchState.COMPLETED,
            timeout=90,
            interval=0.2,
            what=f"batch operation {op_id} completed",
            context=lambda: cluster.log_tail("engine"),
        )
    finally:
        await store.close()
    # The saga in flight at the crash was read again and skipped: its history had the cancel.
    assert (done.acted, done.skipped, done.failed) == (SAGAS - 1, 1, 0)
    assert done.lease_owner is None
    statuses = await cluster.wait_settled(ids)
    assert set(statuses.values()) == {SagaStatus.CANCELLED}
    cancels = await _cancels(cluster, op_id)
    assert cancels == Counter(dict.fromkeys(ids, 1))
    # Exactly one effect per command, and each saga's applied step reverted once.
    await cluster.check_effects(
        dict.fromkeys(ids, SagaStatus.CANCELLED), dict.fromkeys(ids, "beta")
    )
    reverts = Counter(r["saga_id"] for r in await cluster.ledger("alpha") if r["kind"] == "revert")
    assert reverts == Counter(dict.fromkeys(ids, 1))


async def test_two_engines_one_holds_the_operation_and_the_other_takes_over_its_crash(
    participants_up: Cluster,
) -> None:
    cluster = participants_up
    slow = {**BATCHES, "SAGA_BATCHES__RATE_PER_S": "8"}
    for name in ("engine-1", "engine-2"):
        cluster._spawn(name, APP, cluster.env(**slow))
    ids = await _applied_transfers(cluster, 24)
    store, op_id = await _cancel_all(cluster, len(ids))
    try:

        async def under_way() -> bool:
            return (await store.get(op_id)).done >= 5

        await eventually(under_way, timeout=60, interval=0.1)
        # The engine whose log shows the claim holds it; the other waits.
        holders = [n for n in ("engine-1", "engine-2") if op_id in cluster.log_tail(n, 400)]
        assert len(holders) == 1, holders
        [holder] = holders
        [other] = {"engine-1", "engine-2"} - {holder}
        cluster.kill(holder)
        done = await eventually(
            lambda: store.get(op_id),
            until=lambda op: op.state is BatchState.COMPLETED,
            timeout=90,
            interval=0.2,
            what=f"batch operation {op_id} completed",
            context=lambda: cluster.log_tail(other),
        )
    finally:
        await store.close()
    assert op_id in cluster.log_tail(other, 400)  # it took the operation over
    assert done.failed == 0
    assert done.acted + done.skipped == len(ids)
    assert done.skipped <= 1
    statuses = await cluster.wait_settled(ids)
    assert set(statuses.values()) == {SagaStatus.CANCELLED}
    assert await _cancels(cluster, op_id) == Counter(dict.fromkeys(ids, 1))
    await cluster.check_effects(
        dict.fromkeys(ids, SagaStatus.CANCELLED), dict.fromkeys(ids, "beta")
    )


async def _reruns(cluster: Cluster, op_id: str) -> dict[str, list[str]]:
    """Per original, the sagas started as its reruns (each naming the operation)."""
    conn = await asyncpg.connect(
        cluster.database_dsn, server_settings={"search_path": cluster.schema}
    )
    try:
        rows = await conn.fetch(
            "SELECT saga_id, data->'rerun_of'->>'saga_id' AS original, "
            "data->'rerun_of'->>'reason' AS reason FROM saga_events "
            "WHERE data->>'kind' = 'saga_started' AND data ? 'rerun_of'"
        )
    finally:
        await conn.close()
    assert all(r["reason"] == f"{reason_prefix(op_id)} replay the day" for r in rows)
    found: dict[str, list[str]] = {}
    for r in rows:
        found.setdefault(r["original"], []).append(r["saga_id"])
    return found


async def test_sigkill_after_a_rerun_starts_no_second_rerun(participants_up: Cluster) -> None:
    cluster = participants_up
    cluster._spawn(
        "engine", APP, cluster.env(SAGA_CRASH_AT=f"batch_after_action:{CRASH_AT}", **BATCHES)
    )
    async with SagaClient(cluster.settings) as client:
        ids = [await client.start(Transfer, TransferRequest(amount=1 + i)) for i in range(SAGAS)]
    assert set((await cluster.wait_settled(ids)).values()) == {SagaStatus.COMPLETED}
    pg = PostgresSettings(dsn=SecretStr(cluster.database_dsn), db_schema=cluster.schema)
    store = await PostgresBatchStore.connect(pg)
    op_id = str(uuid.uuid4())
    # The reruns complete too, and then match the filter: the operation passes over them.
    where = BatchFilter(saga_type="transfer", statuses=[SagaStatus.COMPLETED])
    spec = BatchSpec(filter=where, action=BatchAction.RERUN, reason="replay the day")
    await store.create(op_id, spec, "olivia", SAGAS, datetime.now(UTC))
    try:
        assert await cluster.wait_exit("engine") == -9, cluster.log_tail("engine")
        crashed = await store.get(op_id)
        assert (crashed.state, crashed.done) == (BatchState.RUNNING, CRASH_AT - 1)
        assert sum(len(new) for new in (await _reruns(cluster, op_id)).values()) == CRASH_AT

        cluster._spawn("engine", APP, cluster.env(**BATCHES))
        done = await eventually(
            lambda: store.get(op_id),
            until=lambda op: op.state is BatchState.COMPLETED,
            timeout=90,
            interval=0.2,
            what=f"batch operation {op_id} completed",
            context=lambda: cluster.log_tail("engine"),
        )
    finally:
        await store.close()
    # The rerun started just before the crash was found again, not started twice.
    assert (done.acted, done.skipped, done.failed) == (SAGAS - 1, 1, 0)
    reruns = await _reruns(cluster, op_id)
    assert sorted(reruns) == sorted(ids)
    assert all(len(new) == 1 for new in reruns.values()), reruns
    new_ids = [new for [new] in reruns.values()]
    assert set((await cluster.wait_settled(new_ids)).values()) == {SagaStatus.COMPLETED}
    # In the participants' own tables: one apply per command, one per saga and step.
    await cluster.check_effects(dict.fromkeys(ids + new_ids, SagaStatus.COMPLETED), {})

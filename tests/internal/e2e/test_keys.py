"""Per-key concurrency on the real servers: two engine processes, a participant process,
a hundred sagas over a few keys, and a SIGKILL of one engine while they run.

The participant (``keys_app.py``) records each saga's enter and leave in its own table;
per (type, key) no more [enter, leave] intervals overlap than the type's limit, and the
same holds for the histories' [key_acquired, end] intervals. Every saga ends completed,
each effect is applied once, and no slot is left held.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import asyncpg
import pytest

from saga_engine import SagaStatus
from saga_engine.client import SagaClient
from saga_engine.events import KeyAcquired, SagaCompleted
from saga_engine.store import PostgresEventStore
from tests.internal.e2e.harness import Cluster, participant_schema, spawn_participant
from tests.internal.e2e.keys_app import LEDGER_DDL, PARTICIPANT, Locked, Paired, Visit
from tests.waiting import eventually

pytestmark = pytest.mark.integration

LIMITS = {"locked": 1, "paired": 2}


@pytest.fixture
async def keys(cluster: Cluster) -> AsyncIterator[Cluster]:
    async with participant_schema(cluster, PARTICIPANT, LEDGER_DDL) as schema:
        spawn_participant(cluster, PARTICIPANT, schema, "tests.internal.e2e.keys_app")
        yield cluster


def start_engine(cluster: Cluster, name: str) -> None:
    env = {"SAGA_ENGINE__KEY_POLL_S": "0.5", "SAGA_ENGINE__KEY_SWEEP_S": "1"}
    cluster._spawn(
        name,
        ["-m", "saga_engine", "worker", "tests.internal.e2e.keys_app", "--log-level", "INFO"],
        cluster.env(**env),
    )


async def _fetch(cluster: Cluster, sql: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(cluster.database_dsn)
    try:
        return [dict(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


async def ledger(cluster: Cluster) -> list[dict[str, Any]]:
    schema = cluster.participant_schema(PARTICIPANT)
    return await _fetch(
        cluster,
        f'SELECT command_id, saga_id, lane, account, kind, at FROM "{schema}".key_ledger '
        "ORDER BY id",
    )


def most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one instant (an end before a start at a tie)."""
    points = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    open_, most = 0, 0
    for _, step in points:
        open_ += step
        most = max(most, open_)
    return most


async def test_a_key_never_has_more_holders_than_its_limit_across_engines_and_a_kill(
    keys: Cluster,
) -> None:
    cluster = keys
    start_engine(cluster, "engine-a")
    start_engine(cluster, "engine-b")
    await cluster.wait_partitions_taken("engine-a", "engine-b")
    plan = [(Locked, f"acct-{i % 4}") for i in range(80)] + [
        (Paired, f"pair-{i % 2}") for i in range(20)
    ]
    async with SagaClient(cluster.settings) as client:
        ids = {await client.start(cls, Visit(account=acct)): cls.name for cls, acct in plan}

    async def some_left() -> bool:
        rows = await ledger(cluster)
        left = [r for r in rows if r["kind"] == "leave"]
        return len(left) >= 15

    await eventually(
        some_left,
        timeout=90,
        interval=0.2,
        what="fifteen sagas to get through",
        context=cluster.logs_tail,
    )
    cluster.kill("engine-a")  # mid-run: it holds keys, queued sagas and grants owed
    statuses = await cluster.wait_settled(list(ids), timeout=240)
    assert set(statuses.values()) == {SagaStatus.COMPLETED}, Counter(statuses.values())

    rows = await ledger(cluster)
    # Each effect once (the participant deduplicates re-sent commands).
    assert Counter(Counter(r["command_id"] for r in rows).values()) == {1: 200}
    spans: dict[tuple[str, str], dict[str, list[datetime]]] = defaultdict(dict)
    for r in rows:
        spans[(r["lane"], r["account"])].setdefault(r["saga_id"], []).append(r["at"])
    for (lane, account), by_saga in spans.items():
        intervals = [(min(ats), max(ats)) for ats in by_saga.values()]
        assert most_at_once(intervals) <= LIMITS[lane], (lane, account)
    # The limit of two was used: pairs did overlap (the participant saw them).
    assert any(
        most_at_once([(min(a), max(a)) for a in by_saga.values()]) == 2
        for (lane, _), by_saga in spans.items()
        if lane == "paired"
    )

    # The histories say the same: [key_acquired, end] per key, within the limit.
    store = await PostgresEventStore.connect(cluster.settings.pg)
    try:
        held: dict[tuple[str, str], list[tuple[datetime, datetime]]] = defaultdict(list)
        queued = 0
        for saga_id, lane in ids.items():
            history = [s.event for s in (await store.load(saga_id)).events]
            [acquired] = [e for e in history if isinstance(e, KeyAcquired)]
            [end] = [e for e in history if isinstance(e, SagaCompleted)]
            held[(lane, acquired.key)].append((acquired.at, end.at))
            queued += any(e.kind == "key_queued" for e in history)
        for (lane, key), intervals in held.items():
            assert most_at_once(intervals) <= LIMITS[lane], (lane, key)
        assert queued >= 50  # they did wait for each other

        # No key left held by a saga that ended, whichever engine ended it.
        async def no_slot_left() -> bool:
            return await store.key_slots() == []

        await eventually(
            no_slot_left, interval=0.2, what="every key slot released", context=cluster.logs_tail
        )
    finally:
        await store.close()


@pytest.mark.parametrize("point", ["after_key_grant", "before_key_release"])
async def test_an_engine_killed_between_the_store_and_the_history_of_a_key_recovers(
    keys: Cluster, point: str
) -> None:
    """Killed with a slot granted but not recorded, or a saga ended but its slot not
    released: the restarted engine records the grant (asking again) or the sweep
    releases the slot, and every saga of the key still runs, one at a time."""
    cluster = keys
    cluster._spawn(
        "engine",
        ["-m", "saga_engine", "worker", "tests.internal.e2e.keys_app", "--log-level", "INFO"],
        cluster.env(
            SAGA_ENGINE__KEY_POLL_S="0.5",
            SAGA_ENGINE__KEY_SWEEP_S="1",
            SAGA_CRASH_AT=f"{point}:2",
        ),
    )
    async with SagaClient(cluster.settings) as client:
        ids = [await client.start(Locked, Visit(account="acct-x")) for _ in range(4)]
    assert await cluster.wait_exit("engine") != 0  # it killed itself at the point
    assert f"crash point {point} reached" in cluster.log_tail("engine", 200)
    start_engine(cluster, "engine")
    statuses = await cluster.wait_settled(ids, timeout=120)
    assert set(statuses.values()) == {SagaStatus.COMPLETED}
    rows = await ledger(cluster)
    assert Counter(Counter(r["command_id"] for r in rows).values()) == {1: 8}
    by_saga: dict[str, list[datetime]] = defaultdict(list)
    for r in rows:
        by_saga[r["saga_id"]].append(r["at"])
    assert most_at_once([(min(a), max(a)) for a in by_saga.values()]) == 1
    store = await PostgresEventStore.connect(cluster.settings.pg)
    try:

        async def no_slot_left() -> bool:
            return await store.key_slots() == []

        await eventually(
            no_slot_left, interval=0.2, what="every key slot released", context=cluster.logs_tail
        )
    finally:
        await store.close()

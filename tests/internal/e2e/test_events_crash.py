"""Domain events with real engine processes and SIGKILLs.

- Sagas wait for their order's capture; the engine is killed; the captures are
  published while no engine runs; a restarted engine gives each saga its capture once,
  and each applies it once at the participant (counted in its own table).
- The engine is killed right after it kept a capture and before it told the waiting
  sagas (crash point ``event_after_store``, its offset not committed): the restarted
  engine reads the record again, keeps it once, and the saga gets it once.
"""

from __future__ import annotations

from collections import Counter

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from saga_engine import SagaStatus, saga_id_for
from saga_engine.client import SagaClient
from tests.integration.kafka_helpers import ensure_topics
from tests.internal.e2e.harness import Cluster
from tests.waiting import eventually

pytestmark = pytest.mark.integration

APP = ["-m", "saga_engine", "worker", "tests.internal.e2e.events_app", "--log-level", "INFO"]
SAGA = "pay-then-apply"


async def _kinds(cluster: Cluster, saga_id: str) -> list[str]:
    rows = await cluster.query("SELECT kind FROM saga_events WHERE saga_id = $1", saga_id)
    return [r["kind"] for r in rows]


async def _start_waiting(cluster: Cluster, orders: range) -> list[str]:
    async with SagaClient(cluster.settings) as client:
        ids = [
            await client.start(SAGA, {"order_id": o}, idempotency_key=f"order-{o}") for o in orders
        ]
    assert ids == [saga_id_for(SAGA, f"order-{o}") for o in orders]

    async def all_waiting() -> bool:
        for saga_id in ids:
            if "event_awaited" not in await _kinds(cluster, saga_id):
                return False
        return True

    await eventually(all_waiting, timeout=60)
    return ids


async def _publish(cluster: Cluster, orders: range) -> None:
    # The source's topic is the publishing system's: it exists before anything is
    # published, whether or not the engine came far enough to create it before its kill.
    await ensure_topics(cluster.settings.kafka, [f"{cluster.prefix}.captured"])
    producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all")
    await producer.start()
    try:
        for o in orders:
            body = orjson.dumps({"order_id": o, "amount": o * 10})
            await producer.send_and_wait(f"{cluster.prefix}.captured", body)
    finally:
        await producer.stop()


async def _check_once(cluster: Cluster, ids: list[str]) -> None:
    statuses = await cluster.wait_settled(ids)
    assert set(statuses.values()) == {SagaStatus.COMPLETED}, statuses
    for saga_id in ids:
        assert (await _kinds(cluster, saga_id)).count("domain_event_received") == 1
    ledger = await cluster.ledger("alpha")
    per_saga = Counter(r["saga_id"] for r in ledger if r["kind"] == "apply")
    assert per_saga == dict.fromkeys(ids, 1), per_saga


async def test_events_published_while_the_engine_is_dead_are_delivered_once(
    cluster: Cluster,
) -> None:
    cluster.start_participant("alpha")
    cluster._spawn("engine", APP, cluster.env())
    orders = range(1, 9)
    ids = await _start_waiting(cluster, orders)
    cluster.kill("engine")
    await _publish(cluster, orders)
    assert {r["saga_id"] for r in await cluster.ledger("alpha")} == set()
    cluster._spawn("engine", APP, cluster.env())
    await _check_once(cluster, ids)


async def test_sigkill_after_the_fact_is_kept_before_the_sagas_are_told(
    cluster: Cluster,
) -> None:
    cluster.start_participant("alpha")
    cluster._spawn("engine", APP, cluster.env(SAGA_CRASH_AT="event_after_store:2"))
    orders = range(1, 5)
    ids = await _start_waiting(cluster, orders)
    await _publish(cluster, orders)
    assert await cluster.wait_exit("engine") != 0  # killed at the second fact kept
    kept = await cluster.query("SELECT event_id FROM saga_domain_events")
    assert len(kept) >= 2
    cluster._spawn("engine", APP, cluster.env())
    await _check_once(cluster, ids)
    rows = await cluster.query("SELECT event_id, matched FROM saga_domain_events")
    assert len(rows) == len(orders)  # a fact read twice is kept once
    assert all(r["matched"] for r in rows)

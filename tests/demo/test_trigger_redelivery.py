"""The Kafka trigger starts one saga per order, however often its message arrives.

Duplicates on the topic, and a real redelivery: the engine is stopped, the trigger's
consumer group is rewound to the start of the topic, and a new engine consumes every
message again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from saga_engine import saga_id_for
from services_demo.demo_kit import Demo, topic_partitions
from services_demo.run import DemoStack
from tests.waiting import eventually

pytestmark = pytest.mark.integration


async def _until(
    stack: DemoStack, what: str, probe: Callable[[], Awaitable[bool]], within_s: float = 60.0
) -> None:
    await eventually(
        probe,
        timeout=within_s,
        interval=0.1,
        what=what,
        context=lambda: "\n".join(f"--- {n}\n{stack.log_tail(n)}" for n in stack.procs),
    )


async def _rewind(bootstrap: str, topic: str, group: str) -> None:
    """Commits offset 0 on every partition for ``group`` (which must have no members)."""
    partitions = await topic_partitions(bootstrap, topic)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign(partitions)
        await consumer.commit(dict.fromkeys(partitions, 0))
    finally:
        await consumer.stop()


async def test_a_redelivered_message_never_starts_a_second_saga(
    stack: DemoStack, demo: Demo
) -> None:
    engine_sagas = f'"{demo.target.engine_schema}".sagas'
    orders = [f"redelivered-{demo.run_id}-{n}" for n in range(3)]
    for order_id in orders + orders[:1]:  # the first one twice, as a producer retry would
        message = {"order_id": order_id, "customer": "dave", "items": [{"sku": "mug", "qty": 1}]}
        await demo.send_trigger(orjson.dumps(message), order_id)

    paid: set[str] = set()

    async def all_done() -> bool:
        # Each checkout waits for its order's payment-captured fact: the payment provider
        # calls the orders service's webhook once the order exists (dave's checkouts run
        # one at a time, so the orders appear one after the other).
        for order_id in orders:
            if order_id not in paid and await demo.order(order_id) is not None:
                response = await demo.http.post(
                    f"{demo.url('orders')}/orders/{order_id}/payment", json={"amount": 8}
                )
                assert response.status_code == 202, response.text
                paid.add(order_id)
        n = await demo.db.fetchval(
            f"SELECT count(*) FROM {engine_sagas} "
            "WHERE saga_type = 'checkout' AND status = 'completed'"
        )
        return bool(n == len(orders)) and await demo.trigger_backlog() == 0

    await _until(stack, "the three sagas and every message consumed", all_done)
    balance = (await demo.http.get(f"{demo.url('payments')}/customers/dave")).json()["balance"]

    # A redelivery: every message of the topic is consumed again by a new engine.
    stack.stop_engine()
    await _rewind(
        demo.target.kafka.bootstrap_servers, demo.target.orders_topic, demo.target.trigger_group
    )
    assert await demo.trigger_backlog() == len(orders) + 1
    await stack.restart_engine()

    async def consumed_again() -> bool:
        return await demo.trigger_backlog() == 0

    await _until(stack, "the engine to consume the topic again", consumed_again)

    # The checkouts (each started its shipment as a child saga, counted once below).
    rows = await demo.db.fetch(
        f"SELECT saga_id, idempotency_key, status FROM {engine_sagas} WHERE saga_type = 'checkout'"
    )
    shipments = await demo.db.fetchval(
        f"SELECT count(*) FROM {engine_sagas} WHERE saga_type = 'shipment'"
    )
    assert shipments == len(orders)
    assert sorted(r["idempotency_key"] for r in rows) == sorted(f"order-{o}" for o in orders)
    assert {r["saga_id"] for r in rows} == {saga_id_for("checkout", f"order-{o}") for o in orders}
    assert {r["status"] for r in rows} == {"completed"}
    for row in rows:
        started = await demo.db.fetchval(
            f'SELECT count(*) FROM "{demo.target.engine_schema}".saga_events '
            "WHERE saga_id = $1 AND kind = 'saga_started'",
            row["saga_id"],
        )
        assert started == 1
    # Every effect once: one reservation per order, the balance charged once per order.
    customer = (await demo.http.get(f"{demo.url('payments')}/customers/dave")).json()
    assert customer["balance"] == balance
    mine = [r for r in customer["reservations"] if r["order_id"] in orders]
    assert sorted(r["order_id"] for r in mine) == sorted(orders)
    assert all(r["status"] == "reserved" and r["amount"] == 8 for r in mine)

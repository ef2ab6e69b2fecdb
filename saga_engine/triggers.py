"""Kafka triggers: start sagas from messages on your own topics.

Declared in Python next to the saga::

    order_requested = KafkaTrigger(
        topic="demo.orders.requested",
        saga=Checkout,
        message=OrderRequested,
        to_input=lambda m: CheckoutInput(order_id=m.order_id, customer=m.customer, items=m.items),
        idempotency_key=lambda m: f"order-{m.order_id}",
    )

``saga worker APP`` finds the triggers in APP (or pass ``triggers=`` to SagaWorker).
Each message becomes a start request on the saga inbox, with the saga id derived from
the idempotency key: a redelivered or duplicated message never starts a second saga. A
message that is not JSON, does not match ``message``, or makes ``to_input`` or
``idempotency_key`` raise, is dead-lettered with its reason.
"""

from saga_engine.core.planning._triggers import KafkaTrigger

__all__ = ["KafkaTrigger"]

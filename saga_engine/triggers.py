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

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from saga_engine._definition import Saga

__all__ = ["KafkaTrigger"]

MsgT = TypeVar("MsgT", bound=BaseModel)


@dataclass(frozen=True)
class KafkaTrigger(Generic[MsgT]):
    topic: str
    saga: type[Saga[Any, Any]]
    message: type[MsgT]
    to_input: Callable[[MsgT], BaseModel | dict[str, Any]]
    idempotency_key: Callable[[MsgT], str]

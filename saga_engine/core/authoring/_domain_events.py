"""Domain events a saga can wait for: another service's facts, correlated by a key.

``EventSource`` is declared next to the sagas (``saga worker APP`` finds the sources in
APP, as it finds triggers): the topic the facts are published on, their pydantic model,
the field that correlates a fact with the sagas waiting for it, and how long a fact is
kept for a saga that has not waited for it yet. ``ctx.wait_event(Model, key=...)`` waits
for one. Pure: the consumer, the store and the matching live in the runner and the store.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from saga_engine.kernel._errors import DefinitionError

__all__ = ["DEFAULT_RETENTION", "EventSource", "key_text", "source_name"]

M = TypeVar("M", bound=BaseModel)

#: How long a fact that no saga waits for yet is kept, unless the source says otherwise.
DEFAULT_RETENTION = timedelta(days=1)


@dataclass(frozen=True)
class EventSource(Generic[M]):
    """Facts of one kind published by another service, that sagas can wait for::

        payment_captured = EventSource(
            topic="payments.captured", model=PaymentCaptured, key="order_id",
            retention=timedelta(hours=6),
        )

    Every record of ``topic`` is read as ``model``; its ``key`` field correlates it with
    the sagas that ``await ctx.wait_event(PaymentCaptured, key=order.id)``. A fact that
    arrives before a saga waits for it is kept for ``retention`` and matched when the
    saga gets there. ``name`` (the model's class name unless given) is what histories
    record: keep it stable once sagas wait for it.
    """

    topic: str
    model: type[M]
    key: str
    retention: timedelta = DEFAULT_RETENTION
    name: str = field(default="")

    def __post_init__(self) -> None:
        if not (isinstance(self.model, type) and issubclass(self.model, BaseModel)):
            raise DefinitionError(f"EventSource needs a pydantic model class, not {self.model!r}")
        if self.key not in self.model.model_fields:
            raise DefinitionError(
                f"EventSource key {self.key!r} is not a field of {self.model.__name__}"
            )
        if not isinstance(self.topic, str) or not self.topic:
            raise DefinitionError("EventSource needs a topic")
        if not isinstance(self.retention, timedelta) or self.retention <= timedelta(0):
            raise DefinitionError("EventSource retention must be a positive timedelta")
        if not self.name:
            object.__setattr__(self, "name", self.model.__name__)

    def key_of(self, event: BaseModel) -> str:
        """The correlation key of ``event`` as histories record it."""
        return key_text(getattr(event, self.key))


def source_name(source: EventSource[Any] | type[BaseModel]) -> str:
    """The name ``ctx.wait_event`` records for ``source`` (a source, or its model)."""
    if isinstance(source, EventSource):
        return source.name
    return source.__name__


def key_text(value: Any) -> str:
    """A correlation key as text: a string, an integer or a UUID, written the same way on
    the waiting side and on the publishing side (``42`` and ``"42"`` are one key)."""
    if isinstance(value, bool) or not isinstance(value, str | int | uuid.UUID):
        raise TypeError(f"a correlation key must be a string, an integer or a UUID, not {value!r}")
    text = str(value)
    if not text or len(text) > 200:
        raise ValueError("a correlation key must be 1 to 200 characters")
    return text

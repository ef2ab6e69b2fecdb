"""Consumes ``EventSource`` topics: each fact is kept, and the sagas waiting for it are
told.

A record becomes a fact (its model, its correlation key, its id: the ``ce_id`` header,
else topic/partition/offset), is kept in the store until its source's retention passes,
and then every saga whose history waits for its source and key is *nudged*: its owner,
whichever engine that is, reloads it through the inbox and, finding it waiting, looks
for the facts kept (``_matcher``). So the fact itself reaches the saga one way only,
from the store through the owner's one path. A record that is not JSON, fails the
model or lacks its key goes to the dead-letter topic with its reason; the loop goes on.
The offsets move only after the fact is stored and the nudges acknowledged: a crash
before that reads the record again, which stores nothing new and nudges again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from aiokafka import AIOKafkaConsumer
from pydantic import ValidationError

from saga_engine.core.authoring._domain_events import EventSource
from saga_engine.kernel._dead_letter_reason import dead_letter_detail, dead_letter_reason
from saga_engine.kernel._errors import (
    DefinitionError,
    PoisonReason,
    TransientError,
    UnstorableValue,
)
from saga_engine.kernel._retry import OUTAGE
from saga_engine.kernel._serde import check_storable, loads
from saga_engine.runner._clock import Clock
from saga_engine.runner._matcher import Nudge, take_fact
from saga_engine.runner._trigger_consumer import Publish, TriggerConsumer
from saga_engine.store._domain_store import DomainEventStore, StoredFact
from saga_engine.telemetry._health import HealthBoard
from saga_engine.telemetry._telemetry import Telemetry
from saga_engine.transport._bus import DeadLetterPublisher

log = logging.getLogger("saga_engine.events")


def by_topic(sources: Sequence[EventSource[Any]]) -> dict[str, EventSource[Any]]:
    """The sources by topic; DefinitionError when two share a topic or a name."""
    topics: dict[str, EventSource[Any]] = {}
    names: set[str] = set()
    for source in sources:
        if source.topic in topics or source.name in names:
            raise DefinitionError(
                f"two event sources share topic {source.topic!r} or name {source.name!r}"
            )
        topics[source.topic] = source
        names.add(source.name)
    return topics


def read_fact(
    source: EventSource[Any], record: Any, now: datetime
) -> StoredFact | tuple[PoisonReason, str]:
    """The fact a record of ``source``'s topic is, or why it is none."""
    try:
        event = source.model.model_validate(loads(record.value or b""))
    except Exception as exc:  # not JSON, nested too deep, or its model refuses it
        detail = dead_letter_detail(exc)
        if isinstance(exc, ValidationError):
            detail = f"not a valid {source.model.__name__}: {detail}"
        return _reason(exc, reading=True), detail
    try:
        key = source.key_of(event)
    except (TypeError, ValueError) as exc:  # the body holds no usable key
        return PoisonReason.INVALID_BODY, f"its correlation key {source.key!r}: {exc}"
    payload = event.model_dump(mode="json")
    try:
        check_storable(payload, f"event {source.name}")
    except UnstorableValue as exc:
        return _reason(exc, reading=True), dead_letter_detail(exc)
    headers = dict(record.headers or [])
    ce_id = headers.get("ce_id")
    event_id = (
        ce_id.decode(errors="replace")
        if ce_id
        else f"{record.topic}/{record.partition}/{record.offset}"
    )
    return StoredFact(
        source=source.name,
        key=key,
        event_id=event_id[:200],
        payload=payload,
        received_at=now,
        expires_at=now + source.retention,
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
    )


def _reason(exc: Exception, *, reading: bool) -> PoisonReason:
    return dead_letter_reason(exc, reading=reading) or PoisonReason.ENGINE_ERROR


class EventSourceConsumer(TriggerConsumer):
    """The trigger consumer's loop (fetch, one record at a time, offsets after), with a
    fact kept and its waiting sagas nudged for each record instead of a start."""

    def __init__(
        self,
        sources: Sequence[EventSource[Any]],
        consumer: AIOKafkaConsumer,
        *,
        group: str,
        store: DomainEventStore,
        nudge: Nudge,
        clock: Clock,
        publish: Publish,
        dead: DeadLetterPublisher,
        source: str,
        on_dead_letter: Callable[[str], None] | None = None,
        health: HealthBoard | None = None,
        telemetry: Telemetry | None = None,
        crash_hook: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(
            (),
            consumer,
            group=group,
            publish=publish,
            dead=dead,
            source=source,
            on_dead_letter=on_dead_letter,
            health=health,
            telemetry=telemetry,
        )
        self._sources = by_topic(sources)
        self._store = store
        self._nudge = nudge
        self._clock = clock
        self._crash_hook = crash_hook
        #: Facts kept, and sagas nudged (``/metrics``).
        self.stored = 0
        self.nudged = 0

    async def _one(self, record: Any) -> None:
        read = read_fact(self._sources[record.topic], record, self._clock.now())
        if isinstance(read, tuple):
            await self._dead_letter(record, read[0], read[1])
            return
        backoff = OUTAGE.backoff()
        while True:  # retried while Postgres or Kafka is away: the record must not be lost
            try:
                waiting = await take_fact(self._store, read, self._nudge, self._crash_hook)
                break
            except TransientError as exc:
                if not self._running:
                    raise
                log.warning("keeping event %s failed (%s); retrying", read.event_id, exc)
                await backoff.sleep()
        self.stored += 1
        self.nudged += len(waiting)

"""The domain events' pieces a worker builds: their Postgres store (the matcher's and
the admin API's: past one database, each fact in the shard of its key, by the event
store's map), the matcher's loop, and the consumer of the ``EventSource`` topics (only
when the worker's code declares sources)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from saga_engine.core.authoring._domain_events import EventSource
from saga_engine.core.history._codec import CodecChain
from saga_engine.kernel._settings import Settings
from saga_engine.kernel._startup import unreachable_as_unavailable
from saga_engine.runner._event_consumer import EventSourceConsumer, by_topic
from saga_engine.runner._matcher import Nudge
from saga_engine.runner._parts import EngineParts
from saga_engine.store._domain_store import DomainEventStore
from saga_engine.store._pgbase import POSTGRES
from saga_engine.store._pgdomain import PostgresDomainEventStore
from saga_engine.store._shard_router import ShardRouter
from saga_engine.store._sharded_domain import ShardedDomainEventStore
from saga_engine.store._store import EventStore
from saga_engine.telemetry._health import HealthBoard
from saga_engine.telemetry._telemetry import Telemetry
from saga_engine.transport._kafka import (
    KAFKA,
    KafkaDeadLetterPublisher,
    ensure_topics,
    make_consumer,
)

__all__ = ["WorkerEvents"]


class WorkerEvents:
    def __init__(self, store: DomainEventStore, sources: Sequence[EventSource[Any]]):
        self.store = store
        self.sources = list(sources)
        by_topic(self.sources)  # two sources on one topic fail the start, with the reason
        self.consumer: EventSourceConsumer | None = None
        self._parts: EngineParts | None = None

    @classmethod
    async def open(
        cls,
        settings: Settings,
        codec: CodecChain | None,
        sources: Sequence[EventSource[Any]],
        events: EventStore,
        health: HealthBoard | None = None,
    ) -> WorkerEvents:
        """``events``: the worker's event store; a sharded one's map in force routes the
        facts (each shard's pool opens on first use)."""
        if isinstance(events, ShardRouter):
            sharded = ShardedDomainEventStore(
                lambda: events.shard_map, settings.pg, codec, health=health
            )
            return cls(sharded, sources)
        with unreachable_as_unavailable(POSTGRES):
            store = await PostgresDomainEventStore.connect(settings.pg, codec)
        return cls(store, sources)

    async def start(
        self,
        settings: Settings,
        parts: EngineParts,
        dead: KafkaDeadLetterPublisher,
        nudge: Nudge,
        source: str,
        *,
        on_dead_letter: Callable[[str], None] | None = None,
        health: HealthBoard | None = None,
        telemetry: Telemetry | None = None,
        crash_hook: Callable[[str], None] | None = None,
    ) -> None:
        """The matcher's loop; the sources' consumer (its own group: ``{group_id}.events``)."""
        self._parts = parts
        if parts.matcher is not None:
            parts.matcher.start()
        if not self.sources:
            return
        kafka = settings.kafka
        group = f"{kafka.group_id}.events"
        topics = [s.topic for s in self.sources]

        async def no_starts(_: Any) -> None:
            raise AssertionError("the event sources' consumer starts no saga")

        with unreachable_as_unavailable(KAFKA):
            await ensure_topics(kafka, topics)
            self.consumer = EventSourceConsumer(
                self.sources,
                make_consumer(kafka, *topics, group_id=group),
                group=group,
                store=self.store,
                nudge=nudge,
                clock=parts.clock,
                publish=no_starts,
                dead=dead,
                source=source,
                on_dead_letter=on_dead_letter,
                health=health,
                telemetry=telemetry,
                crash_hook=crash_hook,
            )
            await self.consumer.start()

    async def close(self) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            await consumer.stop()
        if self._parts is not None and self._parts.matcher is not None:
            await self._parts.matcher.stop()
        await self.store.close()

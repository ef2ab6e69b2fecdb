"""The concrete adapters a worker builds for the runner's pieces: the command sender on
Kafka (and HTTP), the trigger topics' consumer, the event store on Postgres."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from saga_engine.core.history._codec import CodecChain
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.core.planning._triggers import KafkaTrigger
from saga_engine.kernel._settings import Settings
from saga_engine.kernel._startup import unreachable_as_unavailable
from saga_engine.runner._trigger_consumer import TriggerConsumer
from saga_engine.store._blobs import BlobStore
from saga_engine.store._pgbase import POSTGRES
from saga_engine.store._store import EventStore
from saga_engine.telemetry._health import HealthBoard
from saga_engine.telemetry._telemetry import Telemetry
from saga_engine.transport._child_wire import ENGINE_PARTICIPANTS
from saga_engine.transport._kafka import (
    KafkaCommandSender,
    KafkaDeadLetterPublisher,
    ensure_topics,
    make_consumer,
    send,
)
from saga_engine.transport._record_blobs import RecordBlobs
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import Envelope


class LazyTopicSender:
    """Creates a participant's command topic the first time a command goes to it."""

    def __init__(self, inner: KafkaCommandSender, settings: Settings, topics: Topics) -> None:
        self._inner = inner
        self._settings = settings
        self._topics = topics
        self._ready: set[str] = set()

    async def send_command(self, command: OutboundCommand) -> None:
        await self._ensure_topic(command)
        await self._inner.send_command(command)

    async def start_command(self, command: OutboundCommand) -> Awaitable[None]:
        await self._ensure_topic(command)
        return await self._inner.start_command(command)

    async def _ensure_topic(self, command: OutboundCommand) -> None:
        if command.participant in ENGINE_PARTICIPANTS:
            return  # to the saga inbox, which exists
        topic = self._topics.commands(command.participant)
        if topic not in self._ready:
            await ensure_topics(self._settings.kafka, [topic])
            self._ready.add(topic)


async def open_event_store(
    settings: Settings, codec: CodecChain | None, health: HealthBoard | None = None
) -> EventStore:
    """The Postgres event store (its schema migrated first, unless turned off: on the one
    database, or past one on the control database and every shard)."""
    from saga_engine.store._connect import connect_event_store
    from saga_engine.store._databases import migrate_everywhere

    with unreachable_as_unavailable(POSTGRES):
        if settings.engine.auto_migrate:
            await migrate_everywhere(settings)
        return await connect_event_store(
            settings, codec=codec, blob_store=blob_store(settings), health=health
        )


def record_blobs(store: EventStore, codec: CodecChain | None) -> RecordBlobs | None:
    """Where commands and replies by reference keep and read their blobs: the event
    store's (its database's references, its blob store), when the codec stores payloads
    by reference; None otherwise (records travel inline)."""
    if codec is None or codec.reference is None:
        return None
    make: Callable[[], RecordBlobs] | None = getattr(store, "record_blobs", None)
    return make() if make is not None else None


def blob_store(settings: Settings) -> BlobStore | None:
    """The blob store of payloads stored by reference that is not the event store's own
    ``saga_blobs`` (``SAGA_CODEC__BLOBS__STORE=directory``); None otherwise."""
    from saga_engine.store._blobs import DirectoryBlobStore

    blobs = settings.codec.blobs
    if blobs.enabled and blobs.store == "directory" and blobs.directory:
        return DirectoryBlobStore(blobs.directory)
    return None


def trigger_consumer(
    settings: Settings,
    triggers: Sequence[KafkaTrigger[Any]],
    producer: Any,
    dead: KafkaDeadLetterPublisher,
    source: str,
    *,
    on_dead_letter: Callable[[str], None] | None = None,
    codec: CodecChain | None = None,
    health: HealthBoard | None = None,
    telemetry: Telemetry | None = None,
) -> TriggerConsumer:
    """The trigger topics' consumer (its own group: ``{group_id}.triggers``), publishing
    start requests to the saga inbox through ``producer``."""
    kafka = settings.kafka
    group = f"{kafka.group_id}.triggers"
    inbox = Topics.of(kafka).inbox

    async def publish(envelope: Envelope) -> None:
        await send(producer, inbox, envelope, codec)

    return TriggerConsumer(
        triggers,
        make_consumer(kafka, *(t.topic for t in triggers), group_id=group),
        group=group,
        publish=publish,
        dead=dead,
        source=source,
        on_dead_letter=on_dead_letter,
        health=health,
        telemetry=telemetry,
    )

"""The engine process: the saga inbox consumed from Kafka, ownership by consumer group.

Engine instances join one consumer group on ``{prefix}.inbox``. Every message is keyed
by saga id, so the instance that owns a partition drives the sagas keyed to it; what an
assignment or a revocation does is ``_ownership.InboxOwnership``'s, what a fetched batch
does is ``_inbox.Inbox``'s, and the background work (idle eviction, due wake-ups,
retention) is ``_housekeeping.Housekeeping``'s.

The worker is the engine's composition root: it opens the adapters (Postgres, Kafka,
HTTP), builds the engine's collaborators once (``EngineParts``) and hands the same ones
to the engine, the child links, the admin API, housekeeping and ownership.

Offsets are committed only after the events a batch caused are durable. A message
that can never be processed goes to the dead-letter topic with its reason; it never
loops and never stalls its partition.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from saga_engine.core.authoring._definition import Saga
from saga_engine.core.authoring._domain_events import EventSource
from saga_engine.core.history._codec import CodecChain, PayloadCodec
from saga_engine.core.planning._schedule import Schedule
from saga_engine.core.planning._triggers import KafkaTrigger
from saga_engine.kernel._crash import CrashHook
from saga_engine.kernel._instance import InstanceName
from saga_engine.kernel._retry import OUTAGE
from saga_engine.kernel._settings import Settings
from saga_engine.kernel._startup import start_with_retry, unreachable_as_unavailable
from saga_engine.runner._children import ChildLinks
from saga_engine.runner._engine import Engine
from saga_engine.runner._housekeeping import Housekeeping
from saga_engine.runner._http import HttpCaller, RoutingSender
from saga_engine.runner._partition_ownership import InboxOwnership
from saga_engine.runner._parts import EngineParts
from saga_engine.runner._rollouts import needs_rollouts, refresh_rollouts
from saga_engine.runner._trigger_consumer import TriggerConsumer
from saga_engine.store._pgbase import POSTGRES
from saga_engine.store._store import EventStore
from saga_engine.telemetry._groupwatch import GroupWatch, watch_member
from saga_engine.telemetry._health import HealthBoard
from saga_engine.telemetry._telemetry import Telemetry, default_telemetry, detach_from_trace
from saga_engine.transport._dlq import DeadLetterTopic
from saga_engine.transport._fetch import GuardedFetch
from saga_engine.transport._kafka import (
    KAFKA,
    KafkaCommandSender,
    KafkaDeadLetterPublisher,
    OffsetCommitter,
    ensure_topics,
    make_group_consumer,
    make_producer,
    send,
)
from saga_engine.transport._step_progress_feed import StepProgressFeed
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import Envelope, MessageType, ReloadBody
from saga_engine.worker._adapters import (
    LazyTopicSender,
    open_event_store,
    record_blobs,
    trigger_consumer,
)
from saga_engine.worker._batches import WorkerBatches
from saga_engine.worker._domain_events import WorkerEvents
from saga_engine.worker._inbox import Inbox
from saga_engine.worker._schedules import KafkaStarts, WorkerSchedules

log = logging.getLogger("saga_engine.worker")

#: How long a revocation or a stop waits for offset commits in flight: with the group
#: coordinator away aiokafka retries them until the consumer stops.
_COMMIT_FLUSH_S = 10.0
#: How long a partition whose shard did not answer waits before it is read again.
_HOLD_S = 1.0


class SagaWorker:
    """One engine instance: an Engine fed by the Kafka inbox, with Postgres underneath.

    ``schedules`` (``saga_engine.schedules.Schedule``) are created or updated at its start;
    every worker fires the due schedules of the whole deployment (``_scheduler``).

    Once started, ``engine`` drives the sagas and ``parts`` holds what it was built from
    (its store, live sagas, counters in ``parts.stats``, flow control...)."""

    def __init__(
        self,
        settings: Settings,
        sagas: Sequence[type[Saga[Any, Any]]],
        *,
        store: EventStore | None = None,
        crash_hook: CrashHook | None = None,
        instance_id: str | None = None,
        triggers: Sequence[KafkaTrigger[Any]] = (),
        telemetry: Telemetry | None = None,
        codec: PayloadCodec | CodecChain | None = None,
        schedules: Sequence[Schedule] = (),
        event_sources: Sequence[EventSource[Any]] = (),
    ) -> None:
        """``codec``: seals payloads in Postgres and on Kafka; by default the one
        ``settings.codec`` describes (none unless configured). ``event_sources``: the
        domain events its sagas wait for (``ctx.wait_event``), consumed here."""
        self.settings = settings
        self.codec = (
            CodecChain.of(codec) if codec is not None else CodecChain.from_settings(settings.codec)
        )
        self.schedules = list(schedules)
        self.telemetry = telemetry
        self.sagas = list(sagas)
        self.triggers = list(triggers)
        self.event_sources = list(event_sources)
        self.topics = Topics.of(settings.kafka)
        self.instance_id = instance_id or f"{socket.gethostname()}-{random.getrandbits(32):08x}"
        self._store = store
        self._owns_store = store is None
        self._crash_hook = crash_hook
        #: What is wrong now (a partition no fetch can read, a group that does not
        #: settle): the admin API's /health says ``degraded`` while it holds anything.
        self.health = HealthBoard()
        self.engine: Engine | None = None
        self._parts: EngineParts | None = None
        self._ownership = InboxOwnership(
            inbox=self.topics.inbox,
            default_count=settings.kafka.partitions,
            instance_id=self.instance_id,
            before_revoke=self._before_revoke,
            partition_ids=self._inbox_partition_ids,
            # Late-bound, so that the worker's notify_owner is what the engine calls.
            notify=lambda saga_id: self.notify_owner(saga_id),
            generation=self._group_generation,
        )
        # Set while no batch is being processed: revocation waits for it.
        self._idle = asyncio.Event()
        self._idle.set()
        self._pending_offsets: dict[TopicPartition, int] = {}
        self._running = False
        self.stats_dead_lettered = 0
        self._closed_state()

    def _closed_state(self) -> None:
        """What ``start`` opens, none of it open yet."""
        self._schedules: WorkerSchedules | None = None
        self._batches: WorkerBatches | None = None
        self._trigger_consumer: TriggerConsumer | None = None
        self._events: WorkerEvents | None = None
        self._admin_app: Any = None
        self._admin: Any = None
        #: Reads participants' step reports into the admin's board (with the admin).
        self._step_feed: StepProgressFeed | None = None
        self._http: HttpCaller | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._member: InstanceName | None = None
        self._watch: GroupWatch | None = None
        self._fetch: GuardedFetch | None = None
        self._producer: Any = None
        self._dead: KafkaDeadLetterPublisher | None = None
        self._inbox: Inbox | None = None
        self._task: asyncio.Task[None] | None = None
        self._housekeeping: Housekeeping | None = None
        self._committer: OffsetCommitter | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Opens the store, the producer and the inbox consumer. Waits for Kafka and
        Postgres while they are unreachable (``engine.startup_timeout_s``, default for
        ever), closing what an attempt opened before the next."""
        await start_with_retry(
            f"engine {self.instance_id}",
            self._start,
            self.stop,  # whatever an attempt opened (store, producer) is closed again
            self.settings.engine.startup_timeout_s,
        )

    async def _start(self) -> None:
        if self._store is None:
            self._store = await open_event_store(self.settings, self.codec, self.health)
        with unreachable_as_unavailable(KAFKA):
            await ensure_topics(
                self.settings.kafka, [self.topics.inbox, self.topics.dlq, self.topics.progress]
            )
            self._producer = make_producer(self.settings.kafka)
            await self._producer.start()
        self._dead = KafkaDeadLetterPublisher(self._producer, self.topics.dlq)
        telemetry = self.telemetry or default_telemetry()
        self._events = await WorkerEvents.open(
            self.settings, self.codec, self.event_sources, self._store, self.health
        )
        engine, parts = self._build_engine(self._store, telemetry)
        if needs_rollouts(
            parts.registry, parts.settings.limits
        ):  # before the inbox: no start outruns a rollout
            with unreachable_as_unavailable(POSTGRES):
                await refresh_rollouts(parts)
        self._schedules = await WorkerSchedules.open(
            self.settings,
            parts.registry,
            self.schedules,
            KafkaStarts(
                self._producer,
                self.topics.inbox,
                f"/saga-engine/{self.instance_id}/schedules",
                self.codec,
            ),
            self._crash_hook,
            self._store,
        )
        self._batches = await WorkerBatches.open(
            self.settings, engine, self._store, self.instance_id, self._crash_hook
        )
        if self.settings.admin.enabled:
            # Built before Kafka starts consuming, so a bad admin configuration (no tokens
            # on a public address) fails the start with its one-line reason.
            self._admin_app = self._build_admin(engine, parts)
            telemetry.instrument_app(self._admin_app)
        if self.triggers:
            await self._start_triggers(telemetry)
        await self._start_inbox(engine, parts, telemetry)
        await self._events.start(
            self.settings,
            parts,
            self._dead,
            self.notify_owner,
            f"/saga-engine/{self.instance_id}/events",
            on_dead_letter=self._count_dead_letter,
            health=self.health,
            telemetry=telemetry,
            crash_hook=self._crash_hook,
        )
        self._housekeeping = Housekeeping(
            engine, parts, self._ownership.partitions, self.owns, codec=self.codec
        )
        self._housekeeping.start()
        self._batches.start()
        if self._admin_app is not None:
            from saga_engine.admin._server import serve_admin

            if self._step_feed is not None:
                self._step_feed.start()
                # Reports sent once the worker has started are shown (not waited for ever).
                if not await self._step_feed.positioned(10.0):
                    log.warning("the step progress reader is not reading yet; it goes on trying")
            self._admin = await serve_admin(self._admin_app, self.settings)
            log.info("admin API on %s", self._admin.url)

    def _build_engine(self, store: EventStore, telemetry: Telemetry) -> tuple[Engine, EngineParts]:
        """The engine and its collaborators, and everything else built from the same."""
        broker = KafkaCommandSender(
            self._producer,
            self.topics,
            f"/saga-engine/{self.instance_id}",
            self.codec,
            blobs=(blobs := record_blobs(store, self.codec)),
        )
        kafka_sender = LazyTopicSender(broker, self.settings, self.topics)
        self._http = HttpCaller(self.settings.http, telemetry=telemetry)
        self._parts = parts = EngineParts.build(
            self.settings,
            sagas=self.sagas,
            store=store,
            sender=RoutingSender(kafka_sender, self._http),
            crash_hook=self._crash_hook,
            telemetry=telemetry,
            ownership=self._ownership,
            domain_events=self._events.store if self._events is not None else None,
            command_records=broker.records,
        )
        self.engine = engine = Engine(parts)
        self._http.bind(engine)
        self._ownership.attach(engine, parts)
        assert self._dead is not None
        self._inbox = Inbox(
            engine=engine,
            children=ChildLinks(engine, parts),
            settings=self.settings,
            codec=self.codec,
            blobs=blobs,
            dead=self._dead,
            instance_id=self.instance_id,
            owned=lambda: self._ownership.owned,
            running=lambda: self._running,
            on_dead_letter=self._count_dead_letter,
        )
        return engine, parts

    def _build_admin(self, engine: Engine, parts: EngineParts) -> Any:
        from saga_engine.admin._app import create_admin_app
        from saga_engine.admin._step_board import StepProgressBoard

        assert self._schedules is not None
        # Participants' step reports (tx.progress), read from Kafka by this process.
        # Their counters (read, dropped by reason, stale, evicted) are the engine's: /metrics.
        board = StepProgressBoard.of(self.settings.admin, parts.stats.counts)
        self._step_feed = StepProgressFeed(self.settings.kafka, board.add, parts.stats.counts)
        return create_admin_app(
            engine,
            self.settings,
            parts=parts,
            start_saga=self._start_through_inbox,
            schedules=self._schedules.store,
            health=self.health,
            batches=self._batches.store if self._batches is not None else None,
            dead_letters=DeadLetterTopic(self.settings.kafka),
            step_progress=board,
        )

    async def _start_triggers(self, telemetry: Telemetry) -> None:
        assert self._dead is not None
        with unreachable_as_unavailable(KAFKA):
            await ensure_topics(self.settings.kafka, [t.topic for t in self.triggers])
            self._trigger_consumer = trigger_consumer(
                self.settings,
                self.triggers,
                self._producer,
                self._dead,
                f"/saga-engine/{self.instance_id}/triggers",
                on_dead_letter=self._count_dead_letter,
                codec=self.codec,
                health=self.health,
                telemetry=telemetry,
            )
            await self._trigger_consumer.start()

    async def _start_inbox(self, engine: Engine, parts: EngineParts, telemetry: Telemetry) -> None:
        kafka = self.settings.kafka
        self._member = InstanceName.claim(kafka, kafka.group_id)
        self._consumer = make_group_consumer(
            kafka,
            group_id=kafka.group_id,
            client_id=self.instance_id,
            instance_name=self._member.name,
        )
        self._consumer.subscribe([self.topics.inbox], listener=self._ownership)
        self._committer = OffsetCommitter(
            self._consumer,
            lambda: self._ownership.owned,
            flush_limit_s=_COMMIT_FLUSH_S,
            interval_s=kafka.commit_interval_ms / 1000,
        )
        self._fetch = GuardedFetch(
            self._consumer,
            name=f"engine {self.instance_id}",
            health=self.health,
            on_unreadable=telemetry.count_unreadable,
        )
        # Watching from before the start: a group that does not settle holds start-up.
        self._watch = watch_member(
            self._consumer,
            group=kafka.group_id,
            telemetry=telemetry,
            health=self.health,
            member=self._member.name or self.instance_id,
        )
        with unreachable_as_unavailable(KAFKA):
            await self._consumer.start()
        self._running = True
        self._task = asyncio.get_running_loop().create_task(self._consume(), name="saga-inbox")
        self._task.add_done_callback(self._inbox_ended)
        log.info(
            "engine %s consuming %s as group member %s",
            self.instance_id,
            self.topics.inbox,
            self._member.name or "(dynamic)",
        )

    async def stop(self) -> None:
        """Closes everything ``start`` opened (also after a failed attempt of it)."""
        self._running = False
        if self._admin is not None:
            await self._admin.stop()
            self._admin = None
        step_feed, self._step_feed = self._step_feed, None
        if step_feed is not None:
            await step_feed.stop()
        housekeeping, self._housekeeping = self._housekeeping, None
        if housekeeping is not None:
            await housekeeping.stop()
        batches, self._batches = self._batches, None
        if batches is not None:
            await batches.close()
        task, self._task = self._task, None
        if task is not None:
            await asyncio.wait({task}, timeout=30)
            if not task.done():
                task.cancel()
        schedules, self._schedules = self._schedules, None
        if schedules is not None:
            await schedules.close()
        trigger_consumer, self._trigger_consumer = self._trigger_consumer, None
        if trigger_consumer is not None:
            await trigger_consumer.stop()
        events, self._events = self._events, None
        if events is not None:
            await events.close()
        watch, self._watch = self._watch, None
        if watch is not None:
            await watch.stop()
        await self._stop_consumer()
        await self._ownership.close()
        if self.engine is not None:
            # Kept: its counters are read after a stop (a retried start builds a new one).
            await self.engine.close()
        await self._close_clients()

    async def _stop_consumer(self) -> None:
        consumer = self._consumer
        if consumer is not None:
            await self._commit_pending()
            if self._committer is not None:
                await self._committer.close()
            self._committer = None
            self._consumer = None
            await consumer.stop()
        if self._member is not None:
            self._member.release()
            self._member = None

    async def _close_clients(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.close()
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()
        if self._owns_store and self._store is not None:
            store, self._store = self._store, None
            await store.close()

    def _inbox_ended(self, task: asyncio.Task[None]) -> None:
        """An inbox consumer that died of a bug is said loudly, once, and ``/health``
        fails (503), so that whatever supervises the process restarts it: until then no
        saga input is applied. (``run_forever`` also raises it.)"""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error("the inbox consumer stopped: %r; restart the engine", exc, exc_info=exc)
        self.health.fail("inbox", f"the inbox consumer stopped: {exc!r}; restart the engine")

    async def __aenter__(self) -> SagaWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def run_forever(self) -> None:
        await self.start()
        try:
            assert self._task is not None
            await self._task
        finally:
            await self.stop()

    @property
    def admin_url(self) -> str | None:
        return self._admin.url if self._admin is not None else None

    async def _start_through_inbox(self, saga: Any, input: Any, **options: Any) -> str:
        """Admin starts go through the inbox, so the partition's owner starts the saga."""
        from saga_engine.client._client import SagaClient

        client = SagaClient(
            self.settings,
            source=f"/saga-engine/{self.instance_id}/admin",
            producer=self._producer,
            codec=self.codec,
        )
        return await client.start(saga, input, **options)

    @property
    def parts(self) -> EngineParts:
        """What ``engine`` was built from: its store, live sagas, counters
        (``parts.stats.counts``), flow control... Kept after a stop; raises
        RuntimeError before the first start."""
        if self._parts is None:
            raise RuntimeError(f"engine {self.instance_id} has not started")
        return self._parts

    @property
    def owned_partitions(self) -> set[int]:
        return {tp.partition for tp in self._ownership.owned}

    # ------------------------------------------------------------------ consuming

    async def _consume(self) -> None:
        assert self._fetch is not None
        assert self._inbox is not None
        detach_from_trace()
        backoff = OUTAGE.backoff()
        while self._running:
            try:
                batch = await self._fetch.getmany(timeout_ms=200, max_records=500)
            except KafkaError as exc:
                delay = backoff.next_delay()
                log.warning("inbox fetch failed (%r); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            if not batch:
                continue
            self._idle.clear()
            try:
                # The batch's offsets, registered for commit only once every record of it
                # was applied or dead-lettered: a batch cut short by a stop (cancelled,
                # or a record left unapplied in an outage) must be read again.
                self._pending_offsets.update(await self._inbox.process(batch))
                # Partitions whose shard did not answer: read again from their first
                # record not applied, a moment later; the others go on.
                for tp, offset in self._inbox.held.items():
                    self._fetch.hold(tp, offset, _HOLD_S)
            finally:
                self._idle.set()
            self._checkpoint("before_offset_commit")
            # The batch's events are durable: its offsets may go, in the background (the
            # next fetch need not wait for the coordinator's answer).
            self._submit_pending()

    def _submit_pending(self) -> None:
        if self._pending_offsets and self._committer is not None:
            self._committer.submit(self._pending_offsets)
        self._pending_offsets = {}

    async def _commit_pending(self) -> None:
        """Commits every offset handed over so far (before giving partitions up, at
        stop). A failed commit is logged: the next owner re-reads those records, and the
        engine's deduplication makes them harmless."""
        self._submit_pending()
        if self._committer is not None:
            await self._committer.flush()

    def _count_dead_letter(self, reason: str) -> None:
        """One more record dead-lettered, from the inbox or a trigger topic: the engine's
        counters (``/metrics`` ``dead_lettered``) count both."""
        self.stats_dead_lettered += 1
        if self._parts is not None:
            self._parts.stats.inc("dead_lettered")
            self._parts.stats.inc(f"dead_lettered_{reason}")

    def _checkpoint(self, point: str) -> None:
        if self._crash_hook is not None:
            self._crash_hook(point)

    # ------------------------------------------------------------------ ownership

    @property
    def assigned_event(self) -> asyncio.Event:
        """Set once the first assignment's recovery is done."""
        return self._ownership.assigned_event

    def owns(self, saga_id: str) -> bool:
        """Whether this instance drives ``saga_id``: its inbox partition is assigned here."""
        return self._ownership.owns(saga_id)

    async def notify_owner(self, saga_id: str) -> None:
        """Asks the saga's owner, through the inbox, to reload it from history."""
        assert self._producer is not None
        await send(
            self._producer,
            self.topics.inbox,
            Envelope(
                message_type=MessageType.RELOAD,
                source=f"/saga-engine/{self.instance_id}",
                saga_id=saga_id,
                correlation_id=saga_id,
                body=ReloadBody(changed_by=self.instance_id).model_dump(mode="json"),
            ),
        )

    async def _before_revoke(self) -> None:
        # Finish the batch in hand and commit it before the partitions go elsewhere.
        await self._idle.wait()
        await self._commit_pending()

    def _group_generation(self) -> int | None:
        # aiokafka keeps the generation on its (private) coordinator; None if it moves.
        coordinator = getattr(self._consumer, "_coordinator", None)
        generation = getattr(coordinator, "generation", None)
        return generation if isinstance(generation, int) and generation >= 0 else None

    def _inbox_partition_ids(self) -> set[int] | None:
        return (
            self._consumer.partitions_for_topic(self.topics.inbox)
            if self._consumer is not None
            else None
        )

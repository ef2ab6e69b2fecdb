"""The engine process: the saga inbox consumed from Kafka, ownership by consumer group.

Engine instances join one consumer group on ``{prefix}.inbox``. Every message is keyed
by saga id, so the instance that owns a partition drives the sagas keyed to it; what an
assignment or a revocation does is ``_ownership.InboxOwnership``'s, and the background
work (idle eviction, due wake-ups, retention) is ``_housekeeping.Housekeeping``'s.

Offsets are committed only after the events a batch caused are durable. A message
that can never be processed goes to the dead-letter topic with its reason; it never
loops and never stalls its partition.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import Awaitable, Sequence
from datetime import timedelta
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from saga_engine.core._codec import CodecChain, PayloadCodec
from saga_engine.core._decision import DropReason, OutboundCommand, Reply
from saga_engine.core._definition import Saga
from saga_engine.core._schedule import Schedule
from saga_engine.core._triggers import KafkaTrigger
from saga_engine.kernel._crash import CrashHook
from saga_engine.kernel._errors import (
    CodecError,
    ConcurrencyError,
    IdempotencyConflict,
    InvalidPayload,
    InvalidTransition,
    NewerVersionError,
    NotParent,
    PermanentError,
    PoisonMessage,
    PoisonReason,
    SagaNotFound,
    TransientError,
    UnknownSagaType,
    UnstorableValue,
)
from saga_engine.kernel._instance import InstanceName
from saga_engine.kernel._retry import Backoff
from saga_engine.kernel._settings import Settings
from saga_engine.kernel._startup import reaching, start_with_retry
from saga_engine.runner._engine import Engine
from saga_engine.runner._engine_batch import BatchInput
from saga_engine.runner._housekeeping import Housekeeping
from saga_engine.runner._http import HttpCaller, RoutingSender
from saga_engine.runner._ownership import InboxOwnership
from saga_engine.runner._rollouts import needs_rollouts, refresh_rollouts
from saga_engine.runner._scheduler import KafkaStarts, WorkerSchedules
from saga_engine.runner._trigger_consumer import TriggerConsumer
from saga_engine.store._pgbase import POSTGRES
from saga_engine.store._store import EventStore
from saga_engine.telemetry._groupwatch import GroupWatch, watch_member
from saga_engine.telemetry._health import HealthBoard
from saga_engine.telemetry._telemetry import Telemetry, default_telemetry, detach_from_trace
from saga_engine.transport._child_wire import ENGINE_PARTICIPANTS
from saga_engine.transport._fetch import GuardedFetch
from saga_engine.transport._kafka import (
    KAFKA,
    DeadLetters,
    KafkaCommandSender,
    OffsetCommitter,
    ensure_topics,
    make_group_consumer,
    make_producer,
    send,
)
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import (
    CancelBody,
    Envelope,
    MessageType,
    ReloadBody,
    ReplyBody,
    SignalBody,
    StartBody,
    UndoBody,
    decode,
)

log = logging.getLogger("saga_engine.worker")

#: How long a revocation or a stop waits for offset commits in flight: with the group
#: coordinator away aiokafka retries them until the consumer stops.
_COMMIT_FLUSH_S = 10.0


class _LazyTopicSender:
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


class SagaWorker:
    """One engine instance: an Engine fed by the Kafka inbox, with Postgres underneath.

    ``schedules`` (``saga_engine.schedules.Schedule``) are created or updated at its start;
    every worker fires the due schedules of the whole deployment (``_scheduler``)."""

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
    ) -> None:
        """``codec``: seals payloads in Postgres and on Kafka; by default the one
        ``settings.codec`` describes (none unless configured)."""
        self.settings = settings
        self.codec = (
            CodecChain.of(codec) if codec is not None else CodecChain.from_settings(settings.codec)
        )
        self.schedules = list(schedules)
        self._schedules: WorkerSchedules | None = None
        self.telemetry = telemetry
        self.sagas = list(sagas)
        self.triggers = list(triggers)
        self._trigger_consumer: TriggerConsumer | None = None
        self._admin_app: Any = None
        self._admin: Any = None
        self._http: HttpCaller | None = None
        self.topics = Topics.of(settings.kafka)
        self.instance_id = instance_id or f"{socket.gethostname()}-{random.getrandbits(32):08x}"
        self._store = store
        self._owns_store = store is None
        self._crash_hook = crash_hook
        self._consumer: AIOKafkaConsumer | None = None
        self._member: InstanceName | None = None
        #: What is wrong now (a partition no fetch can read, a group that does not
        #: settle): the admin API's /health says ``degraded`` while it holds anything.
        self.health = HealthBoard()
        self._watch: GroupWatch | None = None
        self._fetch: GuardedFetch | None = None
        self._producer: Any = None
        self._dead: DeadLetters | None = None
        self.engine: Engine | None = None
        self._task: asyncio.Task[None] | None = None
        self._housekeeping: Housekeeping | None = None
        self._running = False
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
        #: A record of the batch in hand was given up (stopping, or no longer ours).
        self._abandoned = False
        self._committer: OffsetCommitter | None = None
        self.stats_dead_lettered = 0

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
        from saga_engine.store._migrations import migrate
        from saga_engine.store._pgstore import PostgresEventStore

        kafka = self.settings.kafka
        if self._store is None:
            with reaching(POSTGRES):
                if self.settings.engine.auto_migrate:
                    await migrate(
                        self.settings.pg.dsn.get_secret_value(), self.settings.pg.db_schema
                    )
                self._store = await PostgresEventStore.connect(self.settings.pg, codec=self.codec)
        with reaching(KAFKA):
            await ensure_topics(kafka, [self.topics.inbox, self.topics.dlq])
            self._producer = make_producer(kafka)
            await self._producer.start()
        self._dead = DeadLetters(self._producer, self.topics.dlq)
        kafka_sender = _LazyTopicSender(
            KafkaCommandSender(
                self._producer, self.topics, f"/saga-engine/{self.instance_id}", self.codec
            ),
            self.settings,
            self.topics,
        )
        telemetry = self.telemetry or default_telemetry()
        self._http = HttpCaller(self.settings.http, telemetry=telemetry)
        self.engine = Engine(
            self.settings,
            sagas=self.sagas,
            store=self._store,
            sender=RoutingSender(kafka_sender, self._http),
            crash_hook=self._crash_hook,
            telemetry=telemetry,
            ownership=self._ownership,
        )
        self._http.bind(self.engine)
        self._ownership.attach(self.engine, self._store)
        if needs_rollouts(self.engine):  # before the inbox: no start outruns a rollout
            with reaching(POSTGRES):
                await refresh_rollouts(self.engine)
        self._schedules = await WorkerSchedules.open(
            self.settings, self.engine.registry, self.schedules,
            KafkaStarts(
                self._producer, self.topics.inbox, f"/saga-engine/{self.instance_id}/schedules",
                self.codec,
            ),
            self._crash_hook,
        )  # fmt: skip
        if self.settings.admin.enabled:
            # Built before Kafka starts consuming, so a bad admin configuration (no tokens
            # on a public address) fails the start with its one-line reason.
            from saga_engine.admin._app import create_admin_app

            self._admin_app = create_admin_app(
                self.engine, self.settings, start_saga=self._start_through_inbox,
                schedules=self._schedules.store, health=self.health,
            )  # fmt: skip
            telemetry.instrument_app(self._admin_app)
        if self.triggers:
            with reaching(KAFKA):
                await ensure_topics(kafka, [t.topic for t in self.triggers])
                self._trigger_consumer = TriggerConsumer(
                    self.settings, self.triggers, self._producer, self._dead,
                    f"/saga-engine/{self.instance_id}/triggers",
                    on_dead_letter=self._count_dead_letter, codec=self.codec,
                    health=self.health, telemetry=telemetry,
                )  # fmt: skip
                await self._trigger_consumer.start()
        self._member = InstanceName.claim(kafka, kafka.group_id)
        self._consumer = make_group_consumer(
            kafka,
            group_id=kafka.group_id,
            client_id=self.instance_id,
            instance_name=self._member.name,
        )
        self._consumer.subscribe([self.topics.inbox], listener=self._ownership)
        self._committer = OffsetCommitter(
            self._consumer, lambda: self._ownership.owned, flush_limit_s=_COMMIT_FLUSH_S
        )
        self._fetch = GuardedFetch(
            self._consumer, name=f"engine {self.instance_id}", health=self.health,
            on_unreadable=telemetry.count_unreadable,
        )  # fmt: skip
        # Watching from before the start: a group that does not settle holds start-up.
        self._watch = watch_member(
            self._consumer, group=kafka.group_id, telemetry=telemetry, health=self.health,
            member=self._member.name or self.instance_id,
        )  # fmt: skip
        with reaching(KAFKA):
            await self._consumer.start()
        self._running = True
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._consume(), name="saga-inbox")
        self._task.add_done_callback(self._inbox_ended)
        self._housekeeping = Housekeeping(
            self.engine, self._store, self.settings, self._ownership.partitions, self.owns,
            codec=self.codec,
        )  # fmt: skip
        self._housekeeping.start()
        if self._admin_app is not None:
            from saga_engine.admin._server import serve_admin

            self._admin = await serve_admin(self._admin_app, self.settings)
            log.info("admin API on %s", self._admin.url)
        log.info(
            "engine %s consuming %s as group member %s",
            self.instance_id, self.topics.inbox, self._member.name or "(dynamic)",
        )  # fmt: skip

    async def stop(self) -> None:
        """Closes everything ``start`` opened (also after a failed attempt of it)."""
        self._running = False
        if self._admin is not None:
            await self._admin.stop()
            self._admin = None
        housekeeping, self._housekeeping = self._housekeeping, None
        if housekeeping is not None:
            await housekeeping.stop()
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
        watch, self._watch = self._watch, None
        if watch is not None:
            await watch.stop()
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
        if self.engine is not None:
            # Kept: its stats are read after a stop (a retried start builds a new one).
            await self.engine.close()
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
            self.settings, source=f"/saga-engine/{self.instance_id}/admin", producer=self._producer,
            codec=self.codec,
        )  # fmt: skip
        return await client.start(saga, input, **options)

    @property
    def owned_partitions(self) -> set[int]:
        return {tp.partition for tp in self._ownership.owned}

    # ------------------------------------------------------------------ consuming

    async def _consume(self) -> None:
        assert self._fetch is not None
        detach_from_trace()
        backoff = Backoff(0.1, 5.0)
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
                await self._process(batch)
            finally:
                self._idle.set()
            self._checkpoint("before_offset_commit")
            # The batch's events are durable: its offsets may go, in the background (the
            # next fetch need not wait for the coordinator's answer).
            self._submit_pending()

    async def _process(self, batch: dict[TopicPartition, list[Any]]) -> None:
        assert self.engine is not None
        engine = self.engine
        # The batch's offsets, registered for commit only once every record of it was
        # applied or dead-lettered: a batch cut short by a stop (cancelled, or a record
        # left unapplied in an outage) must be read again by the next owner.
        offsets: dict[TopicPartition, int] = {}
        self._abandoned = False
        fast: list[BatchInput] = []
        slow: list[tuple[TopicPartition, Any, Envelope]] = []
        # A saga with any input other than a start or a reply takes the single path for
        # all of its records in this batch, so they keep their partition order.
        slow_sagas: set[str] = set()
        readable: list[tuple[TopicPartition, Any, Envelope]] = []
        for tp, records in batch.items():
            if tp not in self._ownership.owned:
                continue
            offsets[tp] = records[-1].offset + 1
            for record in records:
                try:
                    envelope = self._decode(record)
                except PoisonMessage as exc:
                    await self._dead_letter(record, exc.reason.value, exc.detail)
                    continue
                except Exception as exc:  # a bug in reading must not stop the inbox either
                    log.exception("unexpected error reading a message; dead-lettering it")
                    await self._dead_letter(
                        record, PoisonReason.ENGINE_ERROR, f"{type(exc).__name__}: {exc}"
                    )
                    continue
                readable.append((tp, record, envelope))
                if envelope.message_type not in (MessageType.REPLY, MessageType.START):
                    slow_sagas.add(envelope.saga_id)
        for tp, record, envelope in readable:
            item = None if envelope.saga_id in slow_sagas else self._batch_input(engine, envelope)
            if item is None:
                slow_sagas.add(envelope.saga_id)
                slow.append((tp, record, envelope))
            else:
                item.key = (tp, record, envelope)
                fast.append(item)
        if slow_sagas:
            # Handed back to the single path whole, with the records of the same saga
            # already taken as fast (a later record made the saga slow).
            moved = [i for i in fast if i.saga_id in slow_sagas]
            if moved:
                fast = [i for i in fast if i.saga_id not in slow_sagas]
                slow = sorted([*slow, *(i.key for i in moved)], key=lambda k: k[1].offset)
        loop = asyncio.get_running_loop()
        # Tasks are created in record order and take the saga's lock before their first
        # await, so one saga's messages are applied in partition order.
        tasks = [loop.create_task(self._handle(tp, record, env)) for tp, record, env in slow]
        if fast:
            result = await engine.apply_batch(fast)
            if result.redo or result.reload:
                await self._redo(result.redo, result.reload)
        if tasks:
            await asyncio.gather(*tasks)
        if not self._abandoned:
            self._pending_offsets.update(offsets)

    def _batch_input(self, engine: Engine, env: Envelope) -> BatchInput | None:
        """A start or reply as the batch path takes it; None sends it down the single path
        (which raises the same error again and says what it means)."""
        try:
            if env.message_type is MessageType.REPLY:
                reply: ReplyBody = env.body_as(ReplyBody)
                engine.check_reply_size(reply.payload)
                return BatchInput(
                    env.saga_id,
                    None,
                    reply=Reply(
                        env.command_id,
                        reply.outcome,
                        engine.clock.now(),
                        reply.payload or {},
                        reply.error,
                        env.causation_id,
                    ),
                )
            start: StartBody = env.body_as(StartBody)
            if start.parent is not None:
                return None  # a child's start: its repeat must be answered (single path)
            prepared = engine.prepare_start(
                env.saga_type or env.subject,
                start.input,
                saga_id=env.saga_id,
                idempotency_key=start.idempotency_key,
                deadline=timedelta(seconds=start.deadline_s) if start.deadline_s else None,
                trace_context=_trace_of(env),
                trigger=start.trigger,
                priority=start.priority,
                fairness_key=start.fairness_key,
            )
            return BatchInput(prepared.saga_id, None, start=prepared)
        except Exception:
            return None

    async def _redo(self, redo: list[BatchInput], reload: set[str]) -> None:
        """What the batch path handed back: reloaded first where its events may be
        durable and its commands unsent, then applied one input at a time."""
        assert self.engine is not None
        for saga_id in sorted(reload):
            backoff = Backoff(0.05, 5.0)
            while True:
                try:
                    await self.engine.reload(saga_id)
                    break
                except SagaNotFound:
                    break  # its creation did not land: the start is applied again
                except TransientError as exc:
                    if not self._running:
                        raise
                    log.warning("reloading saga %s failed (%s); retrying", saga_id, exc)
                    await backoff.sleep()
        for item in redo:
            await self._handle(*item.key)

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

    async def _handle(
        self, tp: TopicPartition, record: Any, envelope: Envelope | None = None
    ) -> None:
        """Applies one record (``envelope``: already decoded from it)."""
        backoff = Backoff(0.05, 5.0)
        while True:
            try:
                await self._apply(record, envelope)
                return
            except PoisonMessage as exc:
                await self._dead_letter(record, exc.reason.value, exc.detail)
                return
            except ConcurrencyError as exc:
                if not self._running or tp not in self._ownership.owned:
                    log.info("stale owner for a message of partition %d: %s", tp.partition, exc)
                    return
                # Still ours, and the engine's own retries (rebuilt from history each
                # time) kept losing to another writer: park the message rather than stall
                # the partition.
                await self._dead_letter(
                    record,
                    PoisonReason.ENGINE_ERROR,
                    f"kept conflicting with another writer: {exc}",
                )
                return
            except TransientError as exc:
                if not self._running or tp not in self._ownership.owned:
                    if not self._running:
                        # Not applied: its batch's offsets must not be committed (the
                        # offsets of a partition no longer ours are not committed anyway).
                        self._abandoned = True
                    return
                delay = backoff.next_delay()
                log.warning("transient failure (%s); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)
            except Exception as exc:  # a bug must not stop the inbox: park the message
                log.exception("unexpected error processing a message; dead-lettering it")
                await self._dead_letter(
                    record, PoisonReason.ENGINE_ERROR, f"{type(exc).__name__}: {exc}"
                )
                return

    def _decode(self, record: Any) -> Envelope:
        return decode(
            record.key,
            record.value,
            list(record.headers or []),
            max_bytes=self.settings.kafka.max_message_bytes,
            codec=self.codec,
        )

    async def _apply(self, record: Any, envelope: Envelope | None = None) -> None:
        assert self.engine is not None
        engine = self.engine
        if envelope is None:
            envelope = self._decode(record)
        try:
            await self._route(engine, envelope)
        except SagaNotFound as exc:
            raise PoisonMessage(PoisonReason.UNKNOWN_SAGA, str(exc)) from exc
        except UnknownSagaType as exc:
            raise PoisonMessage(PoisonReason.UNKNOWN_SAGA_TYPE, str(exc)) from exc
        except PoisonMessage:
            raise
        except UnstorableValue as exc:
            raise PoisonMessage(PoisonReason.UNSTORABLE_VALUE, str(exc)) from exc
        except InvalidPayload as exc:
            reason = (
                PoisonReason.INVALID_SIGNAL
                if envelope.message_type is MessageType.SIGNAL
                else PoisonReason.INVALID_INPUT
            )
            raise PoisonMessage(reason, str(exc)) from exc
        except IdempotencyConflict as exc:
            raise PoisonMessage(PoisonReason.IDEMPOTENCY_CONFLICT, str(exc)) from exc
        except NotParent as exc:  # the saga is untouched: its own parent is unaffected
            raise PoisonMessage(PoisonReason.NOT_PARENT, str(exc)) from exc
        except InvalidTransition as exc:
            # A signal or cancel the saga's state refuses (ended, undoing its steps,
            # parked): neither the saga nor the message is at fault, the timing is.
            by_state = envelope.message_type in (MessageType.SIGNAL, MessageType.CANCEL)
            reason = PoisonReason.NOT_ACCEPTED if by_state else PoisonReason.REJECTED
            raise PoisonMessage(reason, str(exc)) from exc
        except NewerVersionError as exc:  # kept for `saga dlq replay` once a newer one runs
            raise PoisonMessage(PoisonReason.NEWER_VERSION, str(exc)) from exc
        except CodecError as exc:  # the saga's history: replayable once the key is here
            raise PoisonMessage(PoisonReason.UNDECODABLE, str(exc)) from exc
        except PermanentError as exc:
            raise PoisonMessage(PoisonReason.REJECTED, str(exc)) from exc

    async def _route(self, engine: Engine, env: Envelope) -> None:
        trace = _trace_of(env)
        kind = env.message_type
        if kind is MessageType.REPLY:
            reply: ReplyBody = env.body_as(ReplyBody)
            decision = await engine.reply(
                env.saga_id, env.command_id, reply.outcome, reply.payload, reply.error,
                sender=env.causation_id,
            )  # fmt: skip
            if decision.dropped is DropReason.UNKNOWN_COMMAND:
                raise PoisonMessage(
                    PoisonReason.UNKNOWN_COMMAND,
                    f"saga {env.saga_id} never issued command {env.command_id!r}",
                )
        elif kind is MessageType.START:
            start: StartBody = env.body_as(StartBody)
            if start.parent is not None:
                await engine.children.start_child(
                    env.saga_type or env.subject, start.input, saga_id=env.saga_id,
                    parent=start.parent, trace_context=trace, priority=start.priority,
                    fairness_key=start.fairness_key,
                )  # fmt: skip
                return
            await engine.start(
                env.saga_type or env.subject,
                start.input,
                saga_id=env.saga_id,
                idempotency_key=start.idempotency_key,
                deadline=timedelta(seconds=start.deadline_s) if start.deadline_s else None,
                trace_context=trace,
                trigger=start.trigger,
                priority=start.priority,
                fairness_key=start.fairness_key,
            )
        elif kind is MessageType.UNDO:
            undo: UndoBody = env.body_as(UndoBody)
            await engine.children.undo_child(
                env.saga_id, env.command_id, undo.parent_id, undo.reason
            )
        elif kind is MessageType.SIGNAL:
            sig: SignalBody = env.body_as(SignalBody)
            await engine.signal(
                env.saga_id,
                sig.name,
                sig.payload,
                signal_id=sig.signal_id,
                principal=sig.principal,
                reason=sig.reason,
            )
        elif kind is MessageType.CANCEL:
            cancel: CancelBody = env.body_as(CancelBody)
            await engine.cancel(env.saga_id, cancel.reason, principal=cancel.principal)
        elif kind is MessageType.RELOAD:
            env.body_as(ReloadBody)  # validated like every body
            await engine.reload(env.saga_id)
        else:
            raise PoisonMessage(
                PoisonReason.UNKNOWN_TYPE, f"{kind.value} does not belong in the saga inbox"
            )

    async def _dead_letter(self, record: Any, reason: str, detail: str) -> None:
        assert self._dead is not None
        backoff = Backoff(0.5, 0.5)
        while True:
            try:
                await self._dead.publish_record(
                    record, reason=reason, detail=detail, consumer=self.instance_id
                )
                break
            except TransientError:
                if not self._running:
                    raise
                await backoff.sleep()
        self._count_dead_letter(reason)

    def _count_dead_letter(self, reason: str) -> None:
        """One more record dead-lettered, from the inbox or a trigger topic: the engine's
        counters (``/metrics`` ``dead_lettered``) count both."""
        self.stats_dead_lettered += 1
        if self.engine is not None:
            self.engine.stats.inc("dead_lettered")
            self.engine.stats.inc(f"dead_lettered_{reason}")

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


def _trace_of(env: Envelope) -> dict[str, str]:
    return {
        k: v for k, v in (("traceparent", env.traceparent), ("tracestate", env.tracestate)) if v
    }

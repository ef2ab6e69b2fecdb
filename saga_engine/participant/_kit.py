"""The participant's front: :class:`Participant` registers the handlers, starts and stops
the whole (topics, migrations, pool, producer, consumer, relay), runs the consumer loop
that hands each fetched batch to the one path (``_batch``) and commits its offsets, and
finishes the batch in hand before a rebalance takes its partitions away. What the kit is
for is said in :mod:`saga_engine.participant`'s docstring."""

from __future__ import annotations

import asyncio
import collections
import inspect
import os
import random
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeVar, get_args

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import BaseModel

from saga_engine.core.history._codec import CodecChain, PayloadCodec
from saga_engine.kernel._crash import CrashHook
from saga_engine.kernel._errors import DefinitionError, Rejected, Retryable
from saga_engine.kernel._instance import InstanceName
from saga_engine.kernel._retry import HANDLER, OUTAGE
from saga_engine.kernel._settings import Settings
from saga_engine.kernel._startup import start_with_retry, unreachable_as_unavailable
from saga_engine.participant._context import CrashPoint, ParticipantContext, Pool, log
from saga_engine.participant._handler import (
    CommandBatch,
    Effects,
    HandlerResult,
    HandlerSpec,
    Isolation,
    Transaction,
)
from saga_engine.participant._ledger import create_ledger
from saga_engine.participant._record_batch import RecordBatchRunner
from saga_engine.participant._relay import Relay
from saga_engine.store._blobs import DirectoryBlobStore
from saga_engine.store._connect import connect_event_store
from saga_engine.store._migrations import PARTICIPANT_MIGRATIONS, migrate
from saga_engine.store._pgbase import POSTGRES
from saga_engine.store._pgblobs import PostgresRecordBlobs
from saga_engine.store._sharded import ShardedEventStore
from saga_engine.telemetry._groupwatch import GroupWatch, watch_member
from saga_engine.telemetry._health import HealthBoard
from saga_engine.telemetry._telemetry import Telemetry, default_telemetry, detach_from_trace
from saga_engine.transport._fetch import GuardedFetch
from saga_engine.transport._kafka import (
    KAFKA,
    OffsetCommitter,
    ensure_topics,
    make_group_consumer,
    make_producer,
)
from saga_engine.transport._record_blobs import RecordBlobs
from saga_engine.transport._topics import Topics

__all__ = ["Participant"]

C = TypeVar("C", bound=BaseModel)
R = TypeVar("R", bound=HandlerResult)
S = TypeVar("S", bound=Sequence[HandlerResult | Rejected | Retryable])
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

_NAME: Final = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
_SCHEMA: Final = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: Records fetched at a time, across partitions: one batch, one transaction, one commit.
_BATCH: Final = 500


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, participant: Participant) -> None:
        self._participant = participant

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._participant._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._participant._on_assigned(set(assigned))


def _database(
    name: str, settings: Settings, dsn: str | None, db_schema: str | None
) -> tuple[str, str]:
    """The participant's database and schema (the arguments, else its settings'), once
    its name and schema are checked: DefinitionError says what to change."""
    if not _NAME.match(name):
        raise DefinitionError(
            f"participant name {name!r} is invalid: use 1 to 100 letters, digits, '_' or "
            "'-' (it becomes part of a Kafka topic and consumer group name)"
        )
    dsn = dsn if dsn is not None else settings.participant.dsn.get_secret_value()
    db_schema = db_schema if db_schema is not None else settings.participant.db_schema
    if not _SCHEMA.match(db_schema):
        raise DefinitionError(
            f"participant schema {db_schema!r} is invalid: use lowercase letters, "
            "digits and '_', starting with a letter or '_'"
        )
    if db_schema == settings.pg.db_schema and dsn == settings.pg.dsn.get_secret_value():
        # Both migration sets record themselves in the schema's schema_migrations.
        raise DefinitionError(
            f"participant {name!r} would share schema {db_schema!r} with the saga "
            "engine's event store; give it a schema of its own (settings.participant.db_schema)"
        )
    return dsn, db_schema


class Participant:
    """A participant service: its command handlers, consumer, database and reply outbox.

    ``settings.participant`` names the service's own database (``dsn`` and ``db_schema``,
    which ``dsn``/``db_schema`` here override); the participant's migrations are applied
    to that schema at start. Business tables may live in any schema of that database.

    ``crash_hook`` is a test seam: it is called with ``"after_commit"`` (a transaction
    committed, its replies not yet published), ``"after_batch_commit"`` (the same, for a
    transaction of two commands or more), ``"after_publish"``, ``"in_batch_handler"``
    (a batch handler returned, its transaction not yet committed) and
    ``"after_optimistic_insert"`` (the outcomes of an optimistic pass inserted, its
    transaction not yet committed). If it raises, the
    participant behaves as if the process died there: it stops at once, commits no
    offset, and ``run`` raises the hook's exception.

    The remaining keywords tune retries and the outbox relay: handler retries wait
    ``backoff_base_s * 2**n`` (capped at ``backoff_max_s``, the upper half of it drawn at
    random: see ``saga_engine.kernel._retry``); the relay runs every
    ``relay_interval_s`` and publishes the outbox rows (the replies that could not be
    published when they were due) older than ``relay_grace_s``.
    """

    def __init__(
        self,
        name: str,
        settings: Settings,
        *,
        dsn: str | None = None,
        db_schema: str | None = None,
        crash_hook: CrashHook | None = None,
        backoff_base_s: float = HANDLER.initial,
        backoff_max_s: float = HANDLER.maximum,
        relay_interval_s: float = 1.0,
        relay_grace_s: float = 5.0,
        stop_timeout_s: float = 10.0,
        telemetry: Telemetry | None = None,
        codec: PayloadCodec | CodecChain | None = None,
    ) -> None:
        """``codec``: opens the commands read, seals the replies sent and stored; by
        default the one ``settings.codec`` describes (none unless configured)."""
        self.name = name
        self.settings = settings
        self.dsn, self.db_schema = _database(name, settings, dsn, db_schema)
        self.codec = (
            CodecChain.of(codec) if codec is not None else CodecChain.from_settings(settings.codec)
        )
        self.topics = Topics.of(settings.kafka)
        #: processed, duplicates, rejected, retryable, dead_lettered, unknown_command,
        #: outbox_relayed, handler_errors (failed attempts), dead_lettered_<reason>.
        self.stats: collections.Counter[str] = collections.Counter()
        self.instance_id = f"{socket.gethostname()}-{os.getpid()}-{random.getrandbits(24):06x}"
        self._handlers: dict[str, HandlerSpec] = {}
        self._crash_hook = crash_hook
        #: Spans ("handle {CommandType}", children of the command's traceparent) and
        #: metrics; the global OpenTelemetry providers unless one is given.
        self.telemetry = telemetry or default_telemetry()
        self._backoff = (backoff_base_s, backoff_max_s)
        self._relay_interval_s = relay_interval_s
        self._relay_grace_s = relay_grace_s
        self._stop_timeout_s = stop_timeout_s
        #: What is wrong now: a partition no fetch can read, a group that does not
        #: settle (each also logged and counted in the metrics).
        self.health = HealthBoard()
        # What start opens and stop closes.
        self._pool: Pool | None = None
        #: The engine's database, for the blobs of records by reference.
        self._blob_pool: Pool | None = None
        #: Past one database: the shards, for the blobs of records by reference.
        self._blob_shards: ShardedEventStore | None = None
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._member: InstanceName | None = None
        self._watch: GroupWatch | None = None
        self._fetch: GuardedFetch | None = None
        self._batches: RecordBatchRunner | None = None
        self._relay: Relay | None = None
        self._committer: OffsetCommitter | None = None
        self._main: asyncio.Task[None] | None = None
        self._relay_task: asyncio.Task[None] | None = None
        self._assigned: set[TopicPartition] = set()
        self._stopping = asyncio.Event()
        self._fatal: BaseException | None = None
        # Set while no batch is being processed: revocation waits for it.
        self._idle = asyncio.Event()
        self._idle.set()
        self._lifecycle = asyncio.Lock()

    # ------------------------------------------------------------------ registration

    def handles(
        self,
        command: type[C],
        *,
        name: str | None = None,
        isolation: Isolation = "read_committed",
        effects: Effects = "transaction",
    ) -> Callable[
        [Callable[[C, Transaction], Awaitable[R]]], Callable[[C, Transaction], Awaitable[R]]
    ]:
        """Registers ``async def handler(cmd, tx)`` for commands of type ``command``.

        The command type on the wire (``ce_subject``) is the model's class name, as the
        engine sends it, unless ``name`` says otherwise. The handler returns its reply
        payload (a pydantic model, a dict or None), or raises :class:`Rejected` (a
        ``failure`` reply) or :class:`Retryable` (a ``retryable`` reply at once).
        ``isolation`` is the transaction's isolation level; serialization failures are
        retried like any other failed attempt.

        ``effects`` says where the handler's effects are. ``"transaction"`` (the
        default): all of them are writes in ``tx``. The kit then claims the command by
        inserting its outcome at the end of the transaction, and a copy of a command
        another transaction is answering or has answered may run the handler in a
        transaction that is rolled back before the stored reply is sent: nothing it
        wrote remains. ``"outside"``: the handler also acts outside ``tx`` (an HTTP call,
        a message, a file, a counter in memory). Its commands are claimed with a lock
        before the handler runs, so a copy whose reply is stored never runs it.
        """
        return self._register(command, name, isolation, effects, batch=False)

    def handles_batch(
        self,
        command: type[C],
        *,
        name: str | None = None,
        isolation: Isolation = "read_committed",
        effects: Effects = "transaction",
    ) -> Callable[
        [Callable[[CommandBatch[C]], Awaitable[S]]], Callable[[CommandBatch[C]], Awaitable[S]]
    ]:
        """Registers ``async def handler(batch)`` for commands of type ``command``: one
        call answers every such command of a transaction (a :class:`CommandBatch`), with
        set-wise statements (an ``unnest`` insert) instead of one per command.

        It returns one entry per command, in order: its reply payload, as ``handles``'s
        handler returns it, or a :class:`Rejected` or :class:`Retryable` *instance*, which
        answers that command alone and says that nothing was written for it (the other
        commands' writes stand). A wrong number of entries, or an entry of another type,
        counts as the handler raising. A handler that raises for several commands is
        called again for each alone, so that one bad command is retried (and finally
        answered ``retryable``) on its own. A saga's commands are still applied in
        record order; ``name``, ``isolation`` and ``effects`` are as for ``handles``.
        """
        return self._register(command, name, isolation, effects, batch=True)

    def _register(
        self,
        command: type[BaseModel],
        name: str | None,
        isolation: Isolation,
        effects: Effects,
        *,
        batch: bool,
    ) -> Callable[[F], F]:
        how = "handles_batch" if batch else "handles"
        if not (isinstance(command, type) and issubclass(command, BaseModel)):
            raise DefinitionError(
                f"{how}() takes the command's pydantic model class, not {command!r}"
            )
        if effects not in get_args(Effects):
            raise DefinitionError(
                f"{how}(effects={effects!r}) is not a place for effects: use "
                '"transaction" (every effect is a write in the handler\'s transaction) or '
                '"outside" (it also acts outside it: an HTTP call, a message)'
            )
        command_type = name or command.__name__

        def register(fn: F) -> F:
            registered = fn  # as given (the check below narrows ``fn``'s type)
            if not inspect.iscoroutinefunction(fn):
                signature = "batch" if batch else "cmd, tx"
                raise DefinitionError(
                    f"the handler for {command_type} must be an async function "
                    f"(async def handler({signature}): ...)"
                )
            if command_type in self._handlers:
                raise DefinitionError(
                    f"participant {self.name!r} already has a handler for {command_type}; "
                    "register one handler per command type"
                )
            self._handlers[command_type] = HandlerSpec(
                command_type, command, fn, isolation, batch, effects
            )
            return registered

        return register

    @property
    def command_types(self) -> list[str]:
        return sorted(self._handlers)

    @property
    def assignment(self) -> set[int]:
        """The command-topic partitions this instance consumes right now."""
        return {tp.partition for tp in self._assigned}

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Creates the topics, migrates the schema, publishes leftover replies, and starts
        consuming. Returns once the consumer has started (partitions come a moment later)."""
        async with self._lifecycle:
            if self._main is not None:
                raise RuntimeError(f"participant {self.name!r} is already running")
            self._stopping.clear()
            self._fatal = None
            # Kafka or the database not up yet: wait (participant.startup_timeout_s).
            await start_with_retry(
                f"participant {self.name}",
                self._open,
                lambda: self._close(graceful=False),
                self.settings.participant.startup_timeout_s,
            )
            loop = asyncio.get_running_loop()
            self._main = loop.create_task(self._consume(), name=f"participant-{self.name}")
            self._main.add_done_callback(self._main_done)
            assert self._relay is not None
            self._relay_task = loop.create_task(self._relay.loop(), name=f"relay-{self.name}")
            log.info(
                "participant %s (%s) consuming %s in schema %s",
                self.name,
                self.instance_id,
                self.topics.commands(self.name),
                self.db_schema,
            )

    async def stop(self) -> None:
        """Finishes the commands in hand (up to ``stop_timeout_s``), commits their offsets
        and closes everything. Idempotent."""
        async with self._lifecycle:
            self._stopping.set()
            main, self._main = self._main, None
            if main is not None:
                await asyncio.wait({main}, timeout=self._stop_timeout_s)
                if not main.done():
                    main.cancel()
                    await asyncio.wait({main})
                if not main.cancelled() and main.exception() is not None:
                    self._fatal = main.exception()
                    log.debug("participant %s stopped after: %r", self.name, self._fatal)
            await self._close(graceful=self._fatal is None)

    async def run(self) -> None:
        """Runs until ``stop()`` is called (from another task) or a crash hook fires."""
        if self._main is None:
            await self.start()
        main = self._main
        assert main is not None
        try:
            await asyncio.shield(main)
        except CrashPoint as crash:
            raise crash.original from None
        finally:
            await self.stop()

    async def __aenter__(self) -> Participant:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _open(self) -> None:
        """Opens the database and Kafka, publishes leftover replies, joins the group."""
        pool, producer = await self._connect()
        ctx = ParticipantContext(
            name=self.name,
            settings=self.settings,
            handlers=self._handlers,
            pool=pool,
            producer=producer,
            stats=self.stats,
            stopping=self._stopping,
            instance_id=self.instance_id,
            crash_hook=self._crash_hook,
            backoff=self._backoff,
            telemetry=self.telemetry,
            codec=self.codec,
            blobs=await self._record_blobs(),
        )
        self._batches = RecordBatchRunner(ctx)
        self._relay = Relay(
            self.name,
            pool,
            producer,
            self.stats,
            self._stopping,
            interval_s=self._relay_interval_s,
            grace_s=self._relay_grace_s,
        )
        # Replies a previous process committed but did not get to publish. No grace
        # period here: a row written by a live instance may go out twice, which the engine
        # tolerates (it deduplicates replies); a row left by a dead one must not wait.
        try:
            await self._relay.pending(grace_s=0.0)
        except Exception as exc:
            log.warning("outbox relay at start failed (%r); the relay loop will retry", exc)
        await self._join_group()

    async def _connect(self) -> tuple[Pool, AIOKafkaProducer]:
        """Creates the topics, migrates the schema, opens the pool and the producer."""
        kafka = self.settings.kafka
        # The participant's own topic, the dead-letter topic, the default reply topic, and
        # the topic of its handlers' step reports (tx.progress).
        wanted = [
            self.topics.commands(self.name),
            self.topics.dlq,
            self.topics.inbox,
            self.topics.progress,
        ]
        with unreachable_as_unavailable(KAFKA):
            await ensure_topics(kafka, wanted)
        with unreachable_as_unavailable(POSTGRES):
            await migrate(self.dsn, self.db_schema, package=PARTICIPANT_MIGRATIONS)
            self._pool = await asyncpg.create_pool(
                self.dsn,
                min_size=1,
                max_size=self.settings.participant.pool_max_size,
                # Unqualified names (ours, and the handlers') resolve in the configured
                # schema.
                server_settings={"search_path": self.db_schema},
            )
            if self.settings.participant.drill_ledger:
                async with self._pool.acquire() as conn:
                    await create_ledger(conn)
        with unreachable_as_unavailable(KAFKA):
            self._producer = make_producer(kafka)
            await self._producer.start()
        return self._pool, self._producer

    async def _record_blobs(self) -> RecordBlobs | None:
        """Where commands and replies by reference keep and read their blobs, when the
        codec stores payloads by reference: the engine's database (``settings.pg``; past
        one database, the shard of each record's saga), whose references keep them, and
        its blob store (``codec.blobs.store``)."""
        if self.codec is None or self.codec.reference is None:
            return None
        pg, blobs = self.settings.pg, self.settings.codec.blobs
        store = None
        if blobs.store == "directory" and blobs.directory:
            store = DirectoryBlobStore(blobs.directory)
        if pg.shards:
            small = pg.model_copy(update={"pool_min_size": 1, "pool_max_size": 2})
            with unreachable_as_unavailable(POSTGRES):
                shards = await connect_event_store(
                    self.settings, pg=small, codec=self.codec, blob_store=store
                )
            assert isinstance(shards, ShardedEventStore)
            self._blob_shards = shards
            return shards.record_blobs()
        with unreachable_as_unavailable(POSTGRES):
            self._blob_pool = await asyncpg.create_pool(
                pg.dsn.get_secret_value(),
                min_size=1,
                max_size=2,
                server_settings={"search_path": pg.db_schema},
            )
        return PostgresRecordBlobs(self._blob_pool, store)

    async def _join_group(self) -> None:
        """Starts the consumer of the command topic, in the participant's group."""
        kafka = self.settings.kafka
        group = self.topics.participant_group(self.name)
        self._member = InstanceName.claim(kafka, group)
        self._consumer = make_group_consumer(
            kafka,
            group_id=group,
            client_id=f"participant-{self.name}-{self.instance_id}",
            instance_name=self._member.name,
        )
        self._consumer.subscribe([self.topics.commands(self.name)], listener=_Rebalance(self))
        self._committer = OffsetCommitter(
            self._consumer,
            lambda: self._assigned,
            flush_limit_s=self._stop_timeout_s,
            interval_s=kafka.commit_interval_ms / 1000,
        )
        self._fetch = GuardedFetch(
            self._consumer,
            name=f"participant {self.name}",
            health=self.health,
            on_unreadable=self.telemetry.count_unreadable,
        )
        # Watching from before the start: a group that does not settle holds start-up.
        self._watch = watch_member(
            self._consumer,
            group=group,
            telemetry=self.telemetry,
            health=self.health,
            member=self._member.name or self.instance_id,
        )
        with unreachable_as_unavailable(KAFKA):
            await self._consumer.start()

    async def _close(self, *, graceful: bool) -> None:
        self._batches, self._relay = None, None
        relay, self._relay_task = self._relay_task, None
        if relay is not None:
            relay.cancel()
            await asyncio.wait({relay})
        committer, self._committer = self._committer, None
        if committer is not None:
            if graceful:
                # What it holds is answered for good: commit it, within the stop timeout.
                await committer.flush()
            # After a crash point, drop it, as a killed process would.
            await committer.close()
        watch, self._watch = self._watch, None
        if watch is not None:
            await watch.stop()
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
        member, self._member = self._member, None
        if member is not None:
            member.release()
        self._assigned.clear()
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()
        for pool in (self._pool, self._blob_pool):
            if pool is not None:
                try:
                    await asyncio.wait_for(pool.close(), timeout=self._stop_timeout_s)
                except TimeoutError:
                    pool.terminate()
        self._pool = self._blob_pool = None
        shards, self._blob_shards = self._blob_shards, None
        if shards is not None:
            await shards.close()

    # ------------------------------------------------------------------ consuming

    async def _consume(self) -> None:
        detach_from_trace()  # each command's work runs in its own trace (its span)
        fetch, runner, committer = self._fetch, self._batches, self._committer
        assert fetch is not None
        assert runner is not None
        assert committer is not None
        backoff = OUTAGE.backoff()
        while not self._stopping.is_set():
            try:
                batches = await fetch.getmany(timeout_ms=200, max_records=_BATCH)
            except KafkaError as exc:
                delay = backoff.next_delay()
                log.warning("command fetch failed (%r); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            backoff.reset()
            records = [
                (tp, record)
                for tp, batch in batches.items()
                if tp in self._assigned
                for record in batch
            ]
            if not records:
                continue
            # The whole fetch is one unit: one transaction, one publish wait, one offset
            # commit. Records of one partition (one saga's commands) stay in order.
            self._idle.clear()
            try:
                offsets = await runner.run(records)
                # Only after the batch's transaction committed and its replies went out
                # (or to the outbox): a record whose offset is committed is answered.
                committer.submit(offsets)
            finally:
                self._idle.set()

    def _main_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        # The batch path handles every expected failure; what escapes is a crash point or
        # a bug, and either way this instance stops rather than skip the record.
        if not isinstance(exc, CrashPoint):
            log.error("participant %s: consuming failed", self.name, exc_info=exc)
        self._fatal = exc
        self._stopping.set()

    # ------------------------------------------------------------------ rebalancing

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        # Finish the batch in hand and commit its offsets before the partitions go to
        # another instance. One that takes too long is left: its transaction commits or
        # rolls back on its own, and its offsets are not committed, so the new owner
        # reads its commands again: its claims wait on ours, then find the stored replies.
        try:
            await asyncio.wait_for(self._idle.wait(), self._stop_timeout_s)
        except TimeoutError:
            log.warning("participant %s: a batch outlived the rebalance", self.name)
        if self._committer is not None:
            await self._committer.flush()
        self._assigned -= revoked
        if self._fetch is not None:
            self._fetch.forget(revoked)
        if not revoked:
            return
        log.info(
            "participant %s gave up partitions %s",
            self.name,
            sorted(tp.partition for tp in revoked),
        )

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        self._assigned |= assigned
        log.info(
            "participant %s took partitions %s", self.name, sorted(tp.partition for tp in assigned)
        )

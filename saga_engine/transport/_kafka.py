"""Kafka plumbing shared by engines, participants and clients (aiokafka).

- ``ensure_topics``: topics are created through the admin client with the partition
  count from settings; the project never relies on auto-creation.
- ``KafkaCommandSender``: the engine's ``CommandSender`` adapter.
- ``KafkaDeadLetterPublisher``: publishes unprocessable records to the dead-letter topic with the
  reason in headers.
- ``OffsetCommitter``: commits a consumer's offsets in the background.
- ``make_consumer``: every consumer the project makes (the engine's inbox, the
  participants', the triggers', the CLI's dead-letter reader), with the same size
  limits; ``make_group_consumer`` adds static membership and sticky assignment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Container, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    TopicAlreadyExistsError,
)

from saga_engine.core.history._codec import CodecChain
from saga_engine.core.history._decision import OutboundCommand
from saga_engine.kernel._errors import KafkaUnavailable, PermanentError
from saga_engine.kernel._partitioning import key_partition
from saga_engine.kernel._retry import is_transient
from saga_engine.kernel._settings import KafkaSettings
from saga_engine.kernel._startup import Dependency

# Re-exported: the acknowledgement wait moved to the sender port (the engine uses it too).
from saga_engine.transport._bus import SEND_TIMEOUT_S as SEND_TIMEOUT_S
from saga_engine.transport._bus import await_acks as await_acks
from saga_engine.transport._command_records import CommandRecords
from saga_engine.transport._kafka_logs import quiet_retried_kafka_errors
from saga_engine.transport._record_blobs import RecordBlobs
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import (
    Envelope,
    Headers,
    encode,
    record_size,
)

log = logging.getLogger("saga_engine.kafka")


async def ensure_topics(
    kafka: KafkaSettings, names: Iterable[str], *, partitions: int | None = None
) -> None:
    """Creates the topics that do not exist yet (idempotent, safe to race)."""
    wanted = sorted(set(names))
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        missing = [n for n in wanted if n not in existing]
        if not missing:
            return
        response = await admin.create_topics(
            [
                NewTopic(
                    name,
                    num_partitions=partitions or kafka.partitions,
                    replication_factor=kafka.replication_factor,
                )
                for name in missing
            ]
        )
        for name, code, message in getattr(response, "topic_errors", []):
            if code not in (0, TopicAlreadyExistsError.errno):
                raise KafkaUnavailable(f"could not create topic {name}: {message} (code {code})")
        # Creation is asynchronous on the broker: wait until the metadata lists the new
        # topics, so a consumer subscribing right after does not start without them.
        deadline = asyncio.get_running_loop().time() + 15
        while not set(missing) <= set(await admin.list_topics()):
            if asyncio.get_running_loop().time() > deadline:
                raise KafkaUnavailable(f"topics {missing} did not appear in the metadata")
            await asyncio.sleep(0.05)
    except KafkaError as exc:
        raise KafkaUnavailable(f"Kafka admin request failed: {exc!r}") from exc
    finally:
        await admin.close()


def make_producer(kafka: KafkaSettings, **overrides: Any) -> AIOKafkaProducer:
    options: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers,
        # acks=all plus idempotence: a broker-acknowledged record is on every in-sync
        # replica, and the producer's own retries cannot duplicate it.
        "acks": "all",
        "enable_idempotence": True,
        # No linger. aiokafka sends one request per broker at a time, so under load the
        # records that queue while a request is in flight go out together in the next
        # one: batching comes from the load, not from a timer. A linger of 1 ms made
        # each partition's batch ready at its own moment and cost 3 produce, fetch and
        # commit requests per saga at 64 in flight instead of 1 (bench/README.md).
        "linger_ms": 0,
        "max_request_size": kafka.max_message_bytes + 64 * 1024,
        # A partition's batch may hold up to the message limit (the broker and the topic
        # allow that plus 64 KiB). aiokafka's default, 16 KiB, held a few dozen commands
        # with their headers: under load the rest of a partition's records waited for the
        # next request, after the first one's acknowledgement (a partition is muted while
        # its batch is in flight), so a batch went out in two produce requests, the
        # second a round trip late (bench/README.md, "Kafka requests per saga").
        "max_batch_size": kafka.max_message_bytes,
        # The default partitioner's choice, with each saga id hashed once (pure-Python
        # murmur2 per record was 2 % of an engine's CPU under load).
        "partitioner": key_partition,
    }
    options.update(overrides)
    quiet_retried_kafka_errors()
    return AIOKafkaProducer(**options)


def make_consumer(
    kafka: KafkaSettings, *topics: str, group_id: str | None, **overrides: Any
) -> AIOKafkaConsumer:
    """A consumer of ``topics`` (or of what it is assigned or subscribes to later) whose
    offsets the caller commits, after its work is done; ``overrides`` are aiokafka's.

    One factory, so that no consumer misses a limit: each was configured on its own
    before, and the triggers' consumer lacked the size limits, so a trigger record
    above aiokafka's 1 MiB default partition fetch was not fetched as the others are.
    """
    options: dict[str, Any] = {
        "bootstrap_servers": kafka.bootstrap_servers,
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": kafka.fetch_max_wait_ms,
        "session_timeout_ms": kafka.session_timeout_ms,
        "heartbeat_interval_ms": kafka.heartbeat_interval_ms,
        # A record up to the message limit (plus its headers) fits one partition fetch.
        "max_partition_fetch_bytes": kafka.max_message_bytes + 64 * 1024,
        # A record above the size limit is still fetched, then dead-lettered as
        # oversized, instead of stalling its partition.
        "fetch_max_bytes": max(52_428_800, 2 * kafka.max_message_bytes),
    }
    options.update(overrides)
    quiet_retried_kafka_errors()
    return AIOKafkaConsumer(*topics, **options)


def make_group_consumer(
    kafka: KafkaSettings, *, group_id: str, client_id: str, instance_name: str | None
) -> AIOKafkaConsumer:
    """A consumer of a group whose offsets the caller commits, after its work is durable.

    - ``instance_name`` (see ``_instance.InstanceName``): static membership. A member
      killed and restarted under its name within the session timeout gets its
      partitions back without a rebalance; the others are not disturbed. (A static
      member sends no LeaveGroup when it stops, so even a clean stop hands its
      partitions over only once the session timeout has passed.)
    - Sticky assignment: a rebalance moves only the partitions it must (the dead
      member's, or a share for a new one). Rebalances here are still eager (every
      member's partitions are revoked, then assigned), so the members keep what stays
      theirs in memory across one, and rebuild only what is new to them.
    """
    return make_consumer(
        kafka,
        group_id=group_id,
        client_id=client_id,
        group_instance_id=instance_name,
        # Exactly one assignor, never more. aiokafka (0.14; upstream PR #1168 is still open)
        # sends a JoinGroup per assignor offered, each with a longer protocol list (sticky,
        # then sticky and round robin). The broker takes a known member's changed protocol
        # list while the group awaits its SyncGroup as a reason for a new generation, so two
        # members started together could keep failing each other's SyncGroup for ever
        # (issue 22: thousands of generations, nothing consumed, start-up never done). With
        # one assignor each rejoin is one JoinGroup with the same list. Members of the
        # previous release offer sticky too, so a rolling upgrade still forms one group.
        partition_assignment_strategy=(own_sticky_assignor(),),
    )


def own_sticky_assignor() -> type[StickyPartitionAssignor]:
    """aiokafka's sticky assignor with state of its own, for one consumer.

    aiokafka (0.14, upstream issue #1175) keeps the sticky assignor's last assignment
    on the class, so every consumer of the process shares it: two workers in one
    process (the testing kit, a test, an app hosting two) each claimed the other's
    partitions at the next rebalance. A subclass per consumer keeps each one's own; its
    protocol name is still ``sticky``, so members of any release form one group.
    """
    return type("StickyPartitionAssignor", (StickyPartitionAssignor,), {})


async def send(
    producer: AIOKafkaProducer, topic: str, envelope: Envelope, codec: CodecChain | None = None
) -> None:
    """Publishes ``envelope`` (its body sealed by ``codec``, if any) and waits for the
    broker's acknowledgement."""
    [error] = await await_acks([await start_send(producer, topic, envelope, codec)])
    if error is not None:
        raise error


async def start_send(
    producer: AIOKafkaProducer, topic: str, envelope: Envelope, codec: CodecChain | None = None
) -> asyncio.Future[Any]:
    """Hands ``envelope`` to the producer and returns the future of its acknowledgement,
    so that many records can be sent and then awaited together."""
    key, value, headers = encode(envelope, codec)
    return await start_record(producer, topic, key, value, headers)


async def start_record(
    producer: AIOKafkaProducer, topic: str, key: bytes, value: bytes, headers: Headers
) -> asyncio.Future[Any]:
    """``start_send`` for a record already encoded."""
    # aiokafka does not refuse a send on a stopped producer; it would wait for metadata
    # that never comes. Fail fast instead, as the in-memory bus does.
    if getattr(producer, "_closed", False):
        raise KafkaUnavailable(f"could not publish to {topic}: the producer is closed")
    delivery: asyncio.Future[Any]
    try:
        if _metadata_known(producer, topic):
            # The send waits for nothing but room in the producer's buffer (bounded by
            # its request timeout), so no deadline of our own is opened (one per record
            # was ~5 us of every send).
            delivery = await producer.send(topic, value, key=key, headers=headers)
        else:
            async with asyncio.timeout(SEND_TIMEOUT_S):
                delivery = await producer.send(topic, value, key=key, headers=headers)
    except TimeoutError as exc:
        raise KafkaUnavailable(f"could not publish to {topic} within {SEND_TIMEOUT_S}s") from exc
    except KafkaError as exc:
        raise publish_error(topic, exc, record_size(value, headers)) from exc
    # The broker's refusal comes with the acknowledgement: it is said as the send's
    # would be (a future and a callback, no task per record).
    ack: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def settle(done: asyncio.Future[Any]) -> None:
        if ack.done():
            return
        if done.cancelled():
            ack.cancel()
        elif (error := done.exception()) is not None:
            if isinstance(error, KafkaError):
                error = publish_error(topic, error, record_size(value, headers))
            ack.set_exception(error)
        else:
            ack.set_result(done.result())

    delivery.add_done_callback(settle)
    return ack


def _metadata_known(producer: AIOKafkaProducer, topic: str) -> bool:
    """Whether ``producer.send`` to ``topic`` can start without waiting for the topic's
    metadata (a stand-in producer without a cluster, as the testing kit's, never waits)."""
    cluster = getattr(getattr(producer, "client", None), "cluster", None)
    return cluster is None or bool(cluster.partitions_for_topic(topic))


def publish_error(topic: str, exc: BaseException, size: int | None = None) -> Exception:
    """What a failed publish to ``topic`` means, by the one rule of what is transient
    (``kernel._retry.is_transient``): a refusal no retry can pass (a record too large
    for the producer or the broker, an authorization failure) is a PermanentError, so
    whoever waits for it is answered at once; anything else may pass (KafkaUnavailable)."""
    if isinstance(exc, KafkaUnavailable):
        return exc
    if is_transient(exc):
        return KafkaUnavailable(f"could not publish to {topic}: {exc!r}")
    if isinstance(exc, MessageSizeTooLargeError | RecordListTooLargeError | RecordTooLargeError):
        of = f" of {size:,} bytes" if size is not None else ""
        return PermanentError(
            f"could not publish to {topic}: the record{of} is too large for the producer or "
            f"the broker ({exc!r}); no retry can send it. Commands above "
            "SAGA_KAFKA__MAX_MESSAGE_BYTES fail their step before they are recorded: the "
            "broker's and the topic's message.max.bytes must allow that limit plus 64 KiB"
        )
    return PermanentError(f"could not publish to {topic}: {exc!r}; no retry can send it")


class KafkaCommandSender:
    """Publishes each command to ``{prefix}.cmd.{participant}``, keyed by saga id.

    ``blobs``: where a command by reference keeps its blob before it is sent (with a
    ``ref`` codec: without, such a command goes inline)."""

    def __init__(
        self,
        producer: AIOKafkaProducer,
        topics: Topics,
        source: str,
        codec: CodecChain | None = None,
        blobs: RecordBlobs | None = None,
    ) -> None:
        self._producer = producer
        self._blobs = blobs
        #: How each command is written (and measured, by the engine's size rule).
        self.records = CommandRecords(topics, source, codec, by_reference=blobs is not None)

    async def send_command(self, command: OutboundCommand) -> None:
        [error] = await await_acks([await self.start_command(command)])
        if error is not None:
            raise error

    async def start_command(self, command: OutboundCommand) -> Awaitable[None]:
        if self._blobs is None:
            return await start_record(self._producer, *self.records.record(command))
        blobs: dict[str, bytes] = {}
        record = self.records.record(command, blobs=blobs)
        if blobs:  # before the record: a reference on the broker never dangles
            await self._blobs.keep(command.saga_id, blobs)
        return await start_record(self._producer, *record)


class KafkaDeadLetterPublisher:
    """Sends a record that cannot be processed to the dead-letter topic, once."""

    def __init__(self, producer: AIOKafkaProducer, topic: str) -> None:
        self._producer = producer
        self.topic = topic

    async def publish_record(self, record: Any, *, reason: str, detail: str, consumer: str) -> None:
        """Dead-letters a consumed aiokafka record, naming where it came from."""
        await self.publish(
            key=record.key,
            value=record.value,
            headers=list(record.headers or []),
            reason=reason,
            detail=detail,
            origin_topic=record.topic,
            origin_partition=record.partition,
            origin_offset=record.offset,
            consumer=consumer,
        )

    async def publish(
        self,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        reason: str,
        detail: str,
        origin_topic: str,
        origin_partition: int,
        origin_offset: int,
        consumer: str,
    ) -> None:
        extra: Headers = [
            ("dlq_reason", reason.encode()),
            ("dlq_detail", detail[:2000].encode(errors="replace")),
            ("dlq_topic", origin_topic.encode()),
            ("dlq_partition", str(origin_partition).encode()),
            ("dlq_offset", str(origin_offset).encode()),
            ("dlq_consumer", consumer.encode()),
        ]
        kept = [(k, v) for k, v in headers if not k.startswith("dlq_")]
        try:
            await self._producer.send_and_wait(self.topic, value, key=key, headers=[*kept, *extra])
        except MessageSizeTooLargeError:
            # Too big even for the dead-letter topic: keep the first 64 KiB and say so.
            truncated = (value or b"")[: 64 * 1024]
            extra.append(("dlq_truncated", str(len(value or b"")).encode()))
            try:
                await self._producer.send_and_wait(
                    self.topic, truncated, key=key, headers=[*kept, *extra]
                )
            except KafkaError as exc:
                raise KafkaUnavailable(f"could not dead-letter a record: {exc!r}") from exc
        except KafkaError as exc:
            raise KafkaUnavailable(f"could not dead-letter a record: {exc!r}") from exc
        log.warning(
            "dead-lettered %s[%d]@%d: %s (%s)",
            origin_topic,
            origin_partition,
            origin_offset,
            reason,
            detail[:200],
        )


class OffsetCommitter:
    """Commits a consumer's offsets in the background, so that the next fetch does not
    wait for the group coordinator's answer (about a tenth of a loaded batch's time).

    The caller hands over offsets only once their records' work is durable, as it would
    commit them itself. Commits go out one at a time, each with the newest offset handed
    over for each partition still owned (``owned`` is asked at commit time), so a commit
    never moves a partition back. A failed commit is logged and dropped, as an awaited one
    would be: the next owner re-reads from the last commit, and readers deduplicate.
    ``flush`` waits (bounded) until everything handed over was committed or failed:
    before a partition is given up, and at stop.

    ``interval_s`` (``kafka.commit_interval_ms``): a commit starts at least this long
    after the one before, with every offset handed over meanwhile, so a busy consumer
    sends a few commits a second rather than one per batch; ``flush`` commits at once.
    A crash re-reads at most that much more (readers deduplicate, as after any crash).
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        owned: Callable[[], Container[TopicPartition]],
        *,
        flush_limit_s: float,
        interval_s: float = 0.0,
    ) -> None:
        self._consumer = consumer
        self._owned = owned
        self._flush_limit_s = flush_limit_s
        self._interval_s = interval_s
        self._pending: dict[TopicPartition, int] = {}
        self._task: asyncio.Task[None] | None = None
        #: When the last commit started (the loop's clock).
        self._last = float("-inf")
        #: Set while a flush waits: what is pending commits without waiting its turn.
        self._now = asyncio.Event()

    def submit(self, offsets: Mapping[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            if offset > self._pending.get(tp, -1):
                self._pending[tp] = offset
        if self._pending and (self._task is None or self._task.done()):
            self._task = asyncio.get_running_loop().create_task(self._run(), name="offset-commit")

    async def flush(self) -> None:
        """Waits until every offset handed over was committed or failed, at most
        ``flush_limit_s``: with the coordinator away, aiokafka retries a commit until the
        consumer stops, and the consumer is stopped only after this returns. What is left
        then is dropped (``close``), as a crash would drop it."""
        self._now.set()
        try:
            async with asyncio.timeout(self._flush_limit_s):
                while self._task is not None and not self._task.done():
                    await asyncio.wait({self._task})
        except TimeoutError:
            log.warning(
                "offset commits still pending after %.0fs; dropping them", self._flush_limit_s
            )
            await self.close()
        finally:
            self._now.clear()

    async def close(self) -> None:
        """Drops what is not committed yet (the next owner re-reads it) and stops."""
        self._pending = {}
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            wait = self._last + self._interval_s - loop.time()
            if wait > 0 and not self._now.is_set():
                # Not before its turn, unless a flush asks for it now.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._now.wait()
            owned = self._owned()
            offsets = {tp: o for tp, o in self._pending.items() if tp in owned}
            self._pending = {}
            if not offsets:
                continue
            self._last = loop.time()
            try:
                await self._consumer.commit(offsets)
            except Exception as exc:
                # Not ours any more (a rebalance), or the broker is away.
                log.info("offset commit failed (%r); the next reader dedups", exc)


def _kafka_unreachable(exc: BaseException) -> bool:
    if isinstance(exc, KafkaConnectionError):
        return True
    return isinstance(exc, KafkaError) and bool(getattr(exc, "retriable", False))


#: Kafka at start-up: unreachable on a refused connection or a retriable broker error
#: (no leader yet, the coordinator loading); any other error is a setting to fix.
KAFKA = Dependency("Kafka", _kafka_unreachable)

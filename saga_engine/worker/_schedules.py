"""The schedules' pieces a worker builds: the Postgres schedule store with the schedules
its code declares (``WorkerSchedules``), and the firings' start requests sent to the
saga inbox on Kafka (``KafkaStarts``); the loop that claims and fires them is the
runner's ``Scheduler``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

from aiokafka.errors import KafkaError

from saga_engine.core.authoring._definition import SagaRegistry
from saga_engine.core.history._codec import CodecChain
from saga_engine.core.planning._schedule import Schedule
from saga_engine.kernel._errors import KafkaUnavailable, MigrationError
from saga_engine.kernel._partitioning import partition_for
from saga_engine.kernel._settings import Settings
from saga_engine.runner._scheduler import Scheduler, utc_now
from saga_engine.store._pgschedules import PostgresScheduleStore
from saga_engine.store._schedule_store import Fire, Firing, saga_status_of
from saga_engine.store._store import EventStore
from saga_engine.transport._kafka import SEND_TIMEOUT_S, await_acks
from saga_engine.transport._wire import Envelope, MessageType, encode

__all__ = ["KafkaStarts", "WorkerSchedules", "start_body"]

log = logging.getLogger("saga_engine.schedules")


class KafkaStarts:
    """Sends firings as start requests on the inbox and waits for every acknowledgement:
    the claim moves its schedules on only after this returns.

    A claim's requests go as one batch per inbox partition (aiokafka's ``send_batch``),
    in the partition Kafka's default partitioner gives the saga id (``partition_for``),
    where ``SagaClient.start`` puts the same saga's start: the per-record ``send`` costs
    several times more, and 10,000 schedules may be due in the same second.
    """

    def __init__(
        self, producer: Any, inbox: str, source: str, codec: CodecChain | None = None
    ) -> None:
        self._producer = producer
        self._inbox = inbox
        self._source = source
        #: The worker's payload codec: a start request carries the schedule's input.
        self._codec = codec
        self._partitions: int | None = None

    async def __call__(self, firings: Sequence[Firing]) -> None:
        producer = self._producer
        if self._partitions is None:
            try:
                async with asyncio.timeout(SEND_TIMEOUT_S):
                    self._partitions = len(await producer.partitions_for(self._inbox))
            except (TimeoutError, KafkaError) as exc:
                raise KafkaUnavailable(f"no metadata for {self._inbox}: {exc!r}") from exc
        batches: dict[int, Any] = {}
        deliveries: list[Awaitable[Any]] = []
        for f in firings:
            key, value, headers = encode(self._envelope(f), self._codec)
            partition = partition_for(f.saga_id, self._partitions)
            batch = batches.get(partition)
            if batch is None:
                batch = batches[partition] = producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
                # Full: this one goes, a new one takes the record.
                deliveries.append(await self._send(batch, partition))
                batch = batches[partition] = producer.create_batch()
                batch.append(key=key, value=value, timestamp=None, headers=headers)
        for partition, batch in batches.items():
            deliveries.append(await self._send(batch, partition))
        for error in await await_acks(deliveries):
            if error is not None:
                raise error

    async def _send(self, batch: Any, partition: int) -> Awaitable[Any]:
        try:
            async with asyncio.timeout(SEND_TIMEOUT_S):
                future: Awaitable[Any] = await self._producer.send_batch(
                    batch, self._inbox, partition=partition
                )
        except (TimeoutError, KafkaError) as exc:
            raise KafkaUnavailable(f"could not publish to {self._inbox}: {exc!r}") from exc
        return future

    def _envelope(self, f: Firing) -> Envelope:
        # Built without validation: every field comes from a definition validated when it
        # was stored (its input against the saga's model), and the body is StartBody's
        # JSON field for field (a unit test compares them). Validating cost a third of a
        # claim's CPU when 10,000 schedules fire in the same second.
        return Envelope.model_construct(
            message_type=MessageType.START,
            source=self._source,
            subject=f.saga_type,
            saga_id=f.saga_id,
            saga_type=f.saga_type,
            correlation_id=f.saga_id,
            body=start_body(f),
        )


def start_body(f: Firing) -> dict[str, Any]:
    """``StartBody(input=..., idempotency_key=...).model_dump(mode="json")``, built as is."""
    return {"input": f.input, "idempotency_key": f.idempotency_key, "deadline_s": None}


class WorkerSchedules:
    """What a worker holds for schedules: the store (the admin API's too), the declared
    schedules upserted at its start, and the scheduler loop (unless disabled)."""

    def __init__(self, store: PostgresScheduleStore, scheduler: Scheduler | None) -> None:
        self.store = store
        self.scheduler = scheduler

    @classmethod
    async def open(
        cls,
        settings: Settings,
        registry: SagaRegistry,
        declared: Sequence[Schedule],
        fire: Fire,
        crash_hook: Callable[[str], None] | None,
        sagas: EventStore,
    ) -> WorkerSchedules:
        """``sagas``: the event store, where ``overlap=skip`` reads the previous sagas'
        statuses past one database (the schedules live in the control database, the
        sagas in the shards); on one database the claim reads them itself."""
        # Checked before anything is written: a declaration naming an unknown saga type,
        # or an input its model refuses, fails the worker's start with the reason.
        for schedule in declared:
            registry.get(schedule.saga).validate_input(schedule.input)
        store = await PostgresScheduleStore.connect(
            settings.pg.control(),
            grace=timedelta(seconds=settings.schedules.grace_s),
            claims_in_flight=settings.schedules.claims_in_flight,
            status_of=saga_status_of(sagas) if settings.pg.shards else None,
        )
        try:
            if not await store.migrated():
                raise MigrationError(
                    f"schema {settings.pg.db_schema!r} lacks saga_schedules or "
                    "saga_schedule_sends (migrations 0007 and 0009): run `saga migrate`"
                )
            now = utc_now()
            for schedule in declared:
                outcome = await store.upsert(schedule, now, origin="code")
                if outcome != "unchanged":
                    log.info("schedule %s %s (%s)", schedule.id, outcome, schedule.spec.describe())
        except BaseException:
            await store.close()
            raise
        scheduler = None
        if settings.schedules.enabled:
            scheduler = Scheduler(store, fire, settings.schedules, crash_hook=crash_hook)
            scheduler.start()
        return cls(store, scheduler)

    async def close(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.stop()
        await self.store.close()

"""The scheduler loop a worker runs: due schedules claimed from Postgres, their ticks'
start requests sent to the saga inbox, then the schedules moved on.

Every worker runs one; they share the due schedules through the claim's row locks
(``_pgschedules``), so any number of engines fire each tick once. The loop sleeps until
the earliest next tick (at most ``schedules.poll_s``), then claims batches of
``schedules.batch_size`` until none is due. With no schedule, each round is one
indexed query.

The start requests go through the inbox like a ``SagaClient`` start, so the engine that
owns the saga's partition starts it, and a start sent twice (the claim's transaction
died after Kafka acknowledged it) is deduplicated there by its saga id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from aiokafka.errors import KafkaError

from saga_engine.core._codec import CodecChain
from saga_engine.core._definition import SagaRegistry
from saga_engine.core._schedule import Schedule
from saga_engine.kernel._errors import KafkaUnavailable, MigrationError, TransientError
from saga_engine.kernel._partitioning import partition_for
from saga_engine.kernel._retry import Backoff
from saga_engine.kernel._settings import ScheduleSettings, Settings
from saga_engine.store._pgschedules import PostgresScheduleStore
from saga_engine.store._schedule_store import Fire, FireResult, Firing, ScheduleStore
from saga_engine.telemetry._telemetry import detach_from_trace
from saga_engine.transport._kafka import SEND_TIMEOUT_S, delivered
from saga_engine.transport._wire import Envelope, MessageType, encode

__all__ = [
    "CRASH_POINT",
    "KafkaStarts",
    "Scheduler",
    "WorkerSchedules",
    "load_schedules",
    "utc_now",
]

log = logging.getLogger("saga_engine.schedules")

#: The crash point between "the ticks' starts are acknowledged by Kafka" and "the claim
#: that moves next_fire_at commits" (``SAGA_CRASH_AT=schedule_after_fire``).
CRASH_POINT = "schedule_after_fire"


def utc_now() -> datetime:
    return datetime.now(UTC)


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
        for error in await delivered(deliveries):
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


class Scheduler:
    """Fires due schedules until stopped. ``clock`` is injectable for tests;
    ``on_fired(result, durable_at)`` is told each claim that fired something."""

    def __init__(
        self,
        store: ScheduleStore,
        fire: Fire,
        settings: ScheduleSettings,
        *,
        clock: Callable[[], datetime] = utc_now,
        crash_hook: Callable[[str], None] | None = None,
        on_fired: Callable[[FireResult, datetime], None] | None = None,
    ) -> None:
        self._store = store
        self._fire = fire
        self._settings = settings
        self._clock = clock
        self._crash_hook = crash_hook
        self._on_fired = on_fired
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.fired = 0
        self.skipped = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="saga-schedules")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            # Cancelled mid-claim, the transaction rolls back: the claimed ticks stay
            # due for the next engine (their starts, if sent, are deduplicated).
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def wake(self) -> None:
        """Look again now (a schedule was created or resumed)."""
        self._wake.set()

    async def run_due(self) -> int:
        """Claims and fires until no schedule is due now; the number of ticks fired.

        A full first batch means a burst: ``claims_in_flight`` claims then run at once
        (SKIP LOCKED gives them disjoint rows), so that one's encoding overlaps another's
        wait for Postgres and Kafka."""
        fired, full = await self._claim()
        if full:
            more = await asyncio.gather(
                *(self._drain() for _ in range(self._settings.claims_in_flight))
            )
            fired += sum(more)
        return fired

    async def _drain(self) -> int:
        fired, full = 0, True
        while full:
            n, full = await self._claim()
            fired += n
        return fired

    async def _claim(self) -> tuple[int, bool]:
        result = await self._store.fire_due(
            self._clock(),
            self._settings.batch_size,
            self._fire,
            clock=self._clock,
            after_fire=self._after_fire,
        )
        self.fired += len(result.fired)
        self.skipped += result.skipped
        if self._on_fired is not None and result.claimed:
            self._on_fired(result, self._clock())
        return len(result.fired), result.claimed >= self._settings.batch_size

    def _after_fire(self) -> None:
        if self._crash_hook is not None:
            self._crash_hook(CRASH_POINT)

    async def _loop(self) -> None:
        detach_from_trace()
        backoff = Backoff(0.5, 10.0)
        poll = self._settings.poll_s
        while True:
            try:
                await self.run_due()
                earliest = await self._store.earliest_due()
                backoff.reset()
            except TransientError as exc:
                delay = backoff.next_delay()
                log.warning("firing schedules failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                continue
            except Exception:  # a bug must not end the loop: log it, and look again later
                log.exception("unexpected error firing schedules")
                await asyncio.sleep(poll)
                continue
            delay = poll
            if earliest is not None:
                delay = min(poll, max(0.0, (earliest - self._clock()).total_seconds()))
            delay = max(delay, self._settings.coalesce_s)
            self._wake.clear()
            try:
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                pass


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
    ) -> WorkerSchedules:
        # Checked before anything is written: a declaration naming an unknown saga type,
        # or an input its model refuses, fails the worker's start with the reason.
        for schedule in declared:
            registry.get(schedule.saga).validate_input(schedule.input)
        store = await PostgresScheduleStore.connect(
            settings.pg,
            grace=timedelta(seconds=settings.schedules.grace_s),
            claims_in_flight=settings.schedules.claims_in_flight,
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


def load_schedules(spec: str) -> list[Schedule]:
    """Every ``Schedule`` defined at the top level of the module named by ``spec`` (what
    ``saga worker APP`` declares, as it finds the module's triggers)."""
    import importlib

    module = importlib.import_module(spec.partition(":")[0])
    return [v for v in vars(module).values() if isinstance(v, Schedule)]

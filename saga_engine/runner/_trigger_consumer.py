"""Consumes trigger topics and turns each message into a saga start on the inbox.

The worker builds it with its Kafka pieces (``worker._adapters.trigger_consumer``): the
consumer of the trigger topics, how a start request is published to the inbox, and
where a record that cannot start a saga goes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import CommitFailedError, KafkaError
from pydantic import BaseModel

from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import saga_id_for
from saga_engine.core.history._events import TriggerOrigin
from saga_engine.core.planning._triggers import KafkaTrigger
from saga_engine.core.runtime._start import StartRequest
from saga_engine.kernel._dead_letter_reason import dead_letter_detail, dead_letter_reason
from saga_engine.kernel._errors import PoisonReason, TransientError
from saga_engine.kernel._retry import OUTAGE
from saga_engine.kernel._serde import JsonDict, check_storable, loads
from saga_engine.telemetry._groupwatch import GroupWatch, watch_member
from saga_engine.telemetry._health import HealthBoard
from saga_engine.telemetry._telemetry import (
    Telemetry,
    carrier_from_headers,
    default_telemetry,
    detach_from_trace,
)
from saga_engine.transport._bus import DeadLetterPublisher
from saga_engine.transport._dead_letter_sending import publish_dead_letter
from saga_engine.transport._fetch import GuardedFetch
from saga_engine.transport._wire import Envelope, start_envelope

log = logging.getLogger("saga_engine.triggers")

#: Publishes a start request to the saga inbox, waiting for the broker's acknowledgement.
Publish = Callable[[Envelope], Awaitable[None]]


class TriggerConsumer:
    """Turns trigger messages into start requests; dead-letters the ones that cannot be.

    ``on_dead_letter`` is told the reason of each record dead-lettered, so that the
    worker counts them with its own (``/metrics`` ``dead_lettered``).
    """

    def __init__(
        self,
        triggers: Sequence[KafkaTrigger[Any]],
        consumer: AIOKafkaConsumer,
        *,
        group: str,
        publish: Publish,
        dead: DeadLetterPublisher,
        source: str,
        on_dead_letter: Callable[[str], None] | None = None,
        health: HealthBoard | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._health = health
        self._telemetry = telemetry or default_telemetry()
        self._fetch: GuardedFetch | None = None
        self._watch: GroupWatch | None = None
        self._by_topic = {t.topic: t for t in triggers}
        self._group = group
        self._publish = publish
        self._dead = dead
        self._source = source
        self._consumer = consumer
        self._task: asyncio.Task[None] | None = None
        self._running = False
        self._on_dead_letter = on_dead_letter
        self.started = 0
        self.dead_lettered = 0

    async def start(self) -> None:
        health = self._health or HealthBoard()
        self._fetch = GuardedFetch(
            self._consumer,
            name=f"triggers {self._source}",
            health=health,
            on_unreadable=self._telemetry.count_unreadable,
        )
        self._watch = watch_member(
            self._consumer,
            group=self._group,
            member=self._source,
            telemetry=self._telemetry,
            health=health,
        )
        await self._consumer.start()
        self._running = True
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="saga-triggers")

    async def stop(self) -> None:
        self._running = False
        if self._task is not None:
            await self._end(self._task)
        if self._watch is not None:
            await self._watch.stop()
        await self._consumer.stop()

    @staticmethod
    async def _end(task: asyncio.Task[None]) -> None:
        """Lets the loop finish its record (ten seconds at most), then collects how it
        ended. A record whose start request was still being retried when the stop came ends
        the loop with that ``TransientError``: its offset was not committed, so it is read
        again after a restart."""
        await asyncio.wait({task}, timeout=10)
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, TransientError):
            log.info("trigger consumer stopped while retrying a record (%s)", exc)
        elif exc is not None:
            log.error("trigger consumer failed", exc_info=exc)

    async def _loop(self) -> None:
        assert self._fetch is not None
        detach_from_trace()
        backoff = OUTAGE.backoff()
        while self._running:
            try:
                batch = await self._fetch.getmany(timeout_ms=200, max_records=200)
            except KafkaError as exc:
                log.warning("trigger fetch failed (%r)", exc)
                await backoff.sleep()
                continue
            backoff.reset()
            offsets = {}
            for tp, records in batch.items():
                for record in records:
                    await self._one(record)
                offsets[tp] = records[-1].offset + 1
            if offsets:
                try:
                    # Committed after the start requests are acknowledged by the broker:
                    # a crash before this re-sends them, and the derived saga id makes
                    # the engine start each saga once.
                    await self._consumer.commit(offsets)
                except (CommitFailedError, KafkaError) as exc:
                    log.warning("trigger offset commit failed (%r)", exc)

    async def _one(self, record: Any) -> None:
        trigger = self._by_topic[record.topic]
        read = _read(trigger, record)
        if isinstance(read[0], PoisonReason):
            await self._dead_letter(record, read[0], str(read[1]))
            return
        payload, key, flow = read
        backoff = OUTAGE.backoff()
        while True:
            try:
                await self._publish(self._envelope(trigger, record, payload, key, flow))
                break
            except TransientError:
                if not self._running:
                    raise
                await backoff.sleep()
        self.started += 1

    def _envelope(
        self, trigger: KafkaTrigger[Any], record: Any, payload: JsonDict, key: str, flow: _Flow
    ) -> Envelope:
        # A producer that traces (W3C headers on the record) gets the saga in its trace.
        trace = carrier_from_headers(record.headers or [])
        request = StartRequest(
            saga_type=trigger.saga.name,
            input=payload,
            saga_id=saga_id_for(trigger.saga.name, key),
            idempotency_key=key,
            trace_context={k: v for k, v in trace.items() if k in ("traceparent", "tracestate")},
            # Recorded in the saga's history: any saga can be traced back to its cause.
            trigger=TriggerOrigin(
                topic=record.topic, partition=record.partition, offset=record.offset
            ),
            priority=flow[0],
            fairness_key=flow[1],
        )
        return start_envelope(request, source=self._source)

    async def _dead_letter(self, record: Any, reason: PoisonReason, detail: str) -> None:
        # Retried while Kafka is away, as the start requests are: an exception here
        # would end the trigger loop, and the record must not be skipped unrecorded.
        await publish_dead_letter(
            self._dead,
            record,
            reason=reason.value,
            detail=detail,
            consumer=self._source,
            running=lambda: self._running,
        )
        self.dead_lettered += 1
        if self._on_dead_letter is not None:
            self._on_dead_letter(reason.value)


#: A trigger's flow control for a start: (priority, fairness key).
_Flow = tuple[int, str | None]


def _read(
    trigger: KafkaTrigger[Any], record: Any
) -> tuple[JsonDict, str, _Flow] | tuple[PoisonReason, str]:
    """The saga's input, idempotency key and flow control a trigger record makes, or why
    it makes none."""
    try:
        message = trigger.message.model_validate(loads(record.value or b""))
    except Exception as exc:  # not JSON, nested too deep, or its model refuses it
        return _refusal(exc, reading=True)
    try:
        value = trigger.to_input(message)
        key = trigger.idempotency_key(message)
        payload = value.model_dump(mode="json") if isinstance(value, BaseModel) else dict(value)
        flow = _flow(trigger, message, payload)
        # Checked here, so the trigger's own record is what goes to the dead-letter
        # topic (with the field named), not a start request made from it.
        check_storable(key, "the idempotency key")
        SagaDefinition.of(trigger.saga).validate_input(payload)
    except Exception as exc:  # the trigger's mapping or the saga's input model refused it
        return _refusal(exc, reading=False)
    return payload, key, flow


def _refusal(exc: Exception, *, reading: bool) -> tuple[PoisonReason, str]:
    """Why ``exc`` makes no start of a record: the trigger's own code raising for it is
    the record's refusal (``rejected``), not the engine's error."""
    reason = dead_letter_reason(exc, reading=reading, unexpected=PoisonReason.REJECTED)
    return reason or PoisonReason.REJECTED, dead_letter_detail(exc)


def _flow(trigger: KafkaTrigger[Any], message: BaseModel, payload: JsonDict) -> _Flow:
    """The start's priority and fairness key, and its concurrency key written into
    ``payload``, as the trigger maps them from ``message`` (a wrong type raises)."""
    priority = trigger.priority(message) if trigger.priority is not None else 0
    if not isinstance(priority, int) or isinstance(priority, bool) or abs(priority) > 1_000_000:
        raise TypeError(f"the trigger's priority must be an int within ±1000000, got {priority!r}")
    fairness = trigger.fairness_key(message) if trigger.fairness_key is not None else None
    if fairness is not None:
        if not isinstance(fairness, str) or len(fairness) > 200:
            raise TypeError(
                f"the trigger's fairness key must be a str of at most 200 characters, got {fairness!r}"
            )
        check_storable(fairness, "the fairness key")
    limit = trigger.saga.concurrency
    if trigger.concurrency_key is not None and limit is not None:
        payload[limit.key] = trigger.concurrency_key(message)
    return priority, fairness

"""What every stage of a batch shares: :class:`ParticipantContext`.

The running participant's connections (the pool, the producer), its settings, handlers,
stats and crash hook, and the acts every stage needs: building a reply, the command's
span, dead-lettering a record, pausing (until the participant stops), passing a crash
point. Also how failures are told apart: an outage (``kernel._retry.is_transient``, the
one rule: the same work may succeed a moment later), the participant stopping (:class:`Abandoned`) and a simulated
death (:class:`CrashPoint`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias

import asyncpg
from aiokafka import AIOKafkaProducer
from opentelemetry.trace import INVALID_SPAN, Span

from saga_engine.core.history._codec import CodecChain
from saga_engine.kernel._crash import CrashHook
from saga_engine.kernel._dead_letter_reason import dead_letter_detail
from saga_engine.kernel._errors import PoisonReason
from saga_engine.kernel._retry import HANDLER, OUTAGE
from saga_engine.kernel._serde import JsonDict
from saga_engine.kernel._settings import Settings
from saga_engine.participant._handler import HandlerSpec, trace_context
from saga_engine.participant._sql import Outgoing, reply_record
from saga_engine.participant._step_reports import StepReporter
from saga_engine.telemetry._telemetry import Telemetry, carrier_of, default_telemetry
from saga_engine.transport._dead_letter_sending import publish_dead_letter
from saga_engine.transport._kafka import KafkaDeadLetterPublisher, ensure_topics
from saga_engine.transport._record_blobs import RecordBlobs
from saga_engine.transport._topics import Topics
from saga_engine.transport._wire import Envelope, ReplyBody

#: A span's trace context and attributes when no span is made.
_NONE: Mapping[str, Any] = MappingProxyType({})

log = logging.getLogger("saga_engine.participant")

Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"


class Abandoned(Exception):
    """The participant is stopping: the record is left for the next consumer (its offset
    is not committed), which deduplicates whatever this one already committed."""


class CrashPoint(BaseException):
    """The crash hook raised at a crash point: the process is to be considered dead.

    A BaseException, so that no ``except Exception`` on the way treats a simulated death
    as an error to recover from; ``Participant.run`` re-raises the hook's own exception.
    """

    def __init__(self, point: str, original: BaseException) -> None:
        self.point = point
        self.original = original
        super().__init__(f"crash hook raised at {point}: {original!r}")


@dataclass(eq=False)
class ParticipantContext:
    """The running participant, as the stages of a batch see it (one per start)."""

    name: str
    settings: Settings
    handlers: Mapping[str, HandlerSpec]
    pool: Pool
    producer: AIOKafkaProducer
    #: The participant's counters (``Participant.stats``), shared.
    stats: collections.Counter[str]
    #: Set when the participant stops: ``pause`` raises Abandoned.
    stopping: asyncio.Event
    instance_id: str
    crash_hook: CrashHook | None = None
    #: A handler's retries: (first delay, cap), as ``kernel._retry.jittered`` takes them.
    backoff: tuple[float, float] = (HANDLER.initial, HANDLER.maximum)
    telemetry: Telemetry = field(default_factory=default_telemetry)
    #: Opens the commands read, seals the replies sent and stored (None: as they are).
    codec: CodecChain | None = None
    #: Where commands and replies by reference keep and read their blobs (the engine's
    #: database; None: records travel inline).
    blobs: RecordBlobs | None = None
    topics: Topics = field(init=False)
    #: The one size limit (``kafka.max_message_bytes``): a reply record above it is
    #: refused here, so that an answer no one can read is never recorded as given.
    reply_limit: int = field(init=False)
    _source: str = field(init=False)
    _dead: KafkaDeadLetterPublisher = field(init=False)
    #: Reply topics known to exist (the inbox is created at start).
    _reply_topics: set[str] = field(init=False)
    #: Sends handlers' reports on their steps (``tx.progress``), fire and forget.
    step_reports: StepReporter = field(init=False)

    def __post_init__(self) -> None:
        kafka = self.settings.kafka
        self.topics = Topics.of(kafka)
        self.reply_limit = kafka.max_message_bytes
        self._source = f"/participants/{self.name}"
        self._dead = KafkaDeadLetterPublisher(self.producer, self.topics.dlq)
        self._reply_topics = {self.topics.inbox}
        self.step_reports = StepReporter(self.producer, self.topics.progress, self.stats)

    # ------------------------------------------------------------------ replies

    async def reply_topic(self, command: Envelope) -> str:
        """Where ``command``'s reply goes, the topic created if it is new to us: the
        outbox must only hold records that can be published (a reply topic that does not
        exist would block the relay's queue; topics are never auto-created)."""
        topic = command.reply_to or self.topics.inbox
        if topic not in self._reply_topics:
            await ensure_topics(self.settings.kafka, [topic])
            self._reply_topics.add(topic)
        return topic

    def reply(
        self, command: Envelope, body: ReplyBody, topic: str, dumped: JsonDict | None = None
    ) -> Outgoing:
        """The reply record of ``body`` to ``command`` (``dumped``: ``body`` as JSON, when
        the caller has it)."""
        return reply_record(
            command,
            body,
            source=self._source,
            topic=topic,
            codec=self.codec,
            by_reference=self.blobs is not None,
            body=dumped,
        )

    def fitted(self, command: Envelope, body: ReplyBody, topic: str) -> Outgoing:
        """A failure or retryable reply, shrunk to fit the size limit rather than not
        sent at all."""
        outgoing = self.reply(command, body, topic)
        if outgoing.size <= self.reply_limit:
            return outgoing
        small = ReplyBody(
            outcome=body.outcome, payload={"truncated": True}, error=(body.error or "")[:1000]
        )
        return self.reply(command, small, topic)

    # ------------------------------------------------------------------ tracing

    def command_span(
        self, record: Any, command: Envelope
    ) -> contextlib.AbstractContextManager[Span]:
        """The "handle {CommandType}" span of one command."""
        # The traceparent is read from the record's own headers (aiokafka's
        # instrumentation does not carry it): this span is a child of the engine's step
        # span, and the reply (built from ``traced(command, span)``) carries this span's
        # context back.
        if not self.telemetry.records:
            # No span to make (no SDK): its context and attributes are not built.
            return self.telemetry.consumer_span(command.subject, _NONE, _NONE)
        attributes = {
            "saga.id": command.saga_id,
            "saga.type": command.saga_type,
            "step": command.step,
            "command.id": command.command_id,
            "compensation": command.compensation,
            "participant": self.name,
            "messaging.system": "kafka",
            "messaging.destination.name": getattr(record, "topic", None),
        }
        return self.telemetry.consumer_span(command.subject, trace_context(command), attributes)

    @staticmethod
    def traced(command: Envelope, span: Span) -> Envelope:
        """``command`` carrying ``span``'s context, so its reply continues the trace."""
        if span is INVALID_SPAN:
            return command  # no span made (no SDK): its carrier is empty
        carrier = carrier_of(span)
        if not carrier:
            return command
        return command.model_copy(
            update={
                "traceparent": carrier.get("traceparent", ""),
                "tracestate": carrier.get("tracestate", ""),
            }
        )

    # ------------------------------------------------------------------ side paths

    async def dead_letter(self, record: Any, reason: str, detail: str) -> None:
        """Sends ``record`` to the dead-letter topic, retrying an outage."""
        await publish_dead_letter(
            self._dead,
            record,
            reason=reason,
            detail=detail,
            consumer=f"participant:{self.name}:{self.instance_id}",
            pause=self.pause,
            backoff=OUTAGE.backoff(),
        )
        self.stats["dead_lettered"] += 1
        self.stats[f"dead_lettered_{reason}"] += 1

    async def engine_error(self, record: Any, exc: Exception) -> None:
        """Dead-letters a record whose processing failed outside any handler, for a
        reason that is no outage (a bug, a broken table), so that it never stalls its
        partition: ``engine_error`` is the contract's reason for "failed unexpectedly"."""
        log.error("participant %s: cannot process a record", self.name, exc_info=exc)
        reason = PoisonReason.ENGINE_ERROR
        await self.dead_letter(record, reason.value, dead_letter_detail(exc, reason))

    async def pause(self, delay: float) -> None:
        """Sleeps ``delay`` seconds; raises Abandoned if the participant stops meanwhile."""
        try:
            await asyncio.wait_for(self.stopping.wait(), delay)
        except TimeoutError:
            return
        raise Abandoned

    def checkpoint(self, point: str) -> None:
        """Passes a crash point (see ``kernel._crash``); CrashPoint if the hook raises."""
        if self.crash_hook is None:
            return
        try:
            self.crash_hook(point)
        except BaseException as exc:
            raise CrashPoint(point, exc) from exc

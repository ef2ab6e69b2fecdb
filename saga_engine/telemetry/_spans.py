"""The engine's spans: one trace per saga, rebuilt from history after a crash.

A saga's life can outlast the process that started it, so its spans cannot simply be
opened and closed in memory:

- **The saga span** ("saga {type}") covers the saga from its start to its terminal state.
  Its ids are chosen when the saga starts and stored in history (``SagaStarted``'s trace
  context: ``traceparent`` is the saga span's context, ``saga-parent`` its caller's span
  id). Whichever engine applies the terminal event emits it then, with those ids and the
  start time from history — so children sent before a crash and after it share one
  parent, and the span is emitted once.
- **Step and compensation spans** ("step {name}" / "compensate {name}") cover one send of
  a command: from the send to the reply or the timeout. Their span ids are derived from
  the command id and attempt, so the span of the forward step a compensation undoes can
  be linked from history alone, after any number of recoveries. The command carries its
  step span's context (``step_context``, put on it by the engine's sender), and the span
  is opened once the engine reports the send (``SagaSpans.opened``): both derive it from
  the command, so tracing never changes what the engine sends or decides.

Preset ids need the SDK's tracer: ``Telemetry`` wraps its tracer's id generator
(``PresetIdGenerator``), which gives a chosen id while one span starts. Without an SDK
nothing is recorded and the context handed on is the caller's, as the API's no-op
tracer does.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    StatusCode,
    TraceFlags,
)

from saga_engine.core.history._decision import PARENT_PARTICIPANT
from saga_engine.core.history._events import (
    AttemptTimedOut,
    Event,
    InvalidReplyReceived,
    ReplyReceived,
    StepAbandoned,
    StepSkipped,
)
from saga_engine.telemetry._telemetry import (
    Telemetry,
    carrier_of,
    carrier_of_context,
    extract,
    preset_ids,
)

if TYPE_CHECKING:
    from saga_engine.core.history._decision import OutboundCommand

#: The events that end a step's span (``SagaSpans.applied``).
_ANSWERS = frozenset(
    {ReplyReceived, AttemptTimedOut, InvalidReplyReceived, StepAbandoned, StepSkipped}
)

#: The trace-context key that marks a saga span owed at the end: the caller's span id
#: (16 hex digits), or "" for a saga that is the root of its trace.
SAGA_PARENT = "saga-parent"


def command_span_id(command_id: str, attempt: int) -> int:
    """The span id of a command's send: the same in every process and after a replay."""
    digest = hashlib.blake2b(f"{command_id}#{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1  # 0 is the invalid span id


def _saga_context(trace_context: Mapping[str, str]) -> SpanContext:
    return trace.get_current_span(extract(trace_context)).get_span_context()


def _ns(at: datetime) -> int:
    return round(at.timestamp() * 1_000_000) * 1000  # datetimes hold microseconds


class SendTime(NamedTuple):
    """When a batch of commands was handed to the sender: their spans start then."""

    wall_ns: int
    perf: float

    @classmethod
    def now(cls) -> SendTime:
        return cls(time.time_ns(), time.perf_counter())


def step_context(command: OutboundCommand) -> dict[str, str]:
    """The W3C context a command carries: its step span's, in the saga's trace, under the
    span id ``command_span_id`` gives it; the same in every process and after a replay.
    A saga with no valid context (started where nothing recorded) keeps what it has."""
    saga = _saga_context(command.trace_context)
    if not saga.is_valid:
        return command.trace_context
    step = SpanContext(
        saga.trace_id,
        command_span_id(command.command_id, command.attempt),
        is_remote=False,
        trace_flags=saga.trace_flags,
        trace_state=saga.trace_state,
    )
    return carrier_of(NonRecordingSpan(step))


def _compensated(command: OutboundCommand) -> list[Link]:
    """A compensation's links to the spans of the forward attempts it undoes."""
    saga = _saga_context(command.trace_context)
    if not command.compensation or not saga.is_valid:
        return []
    return [
        Link(
            SpanContext(
                saga.trace_id,
                command_span_id(forward_id, attempt),
                is_remote=True,
                trace_flags=TraceFlags(saga.trace_flags),
            ),
            {"link.kind": "compensates"},
        )
        for forward_id, attempt in zip(
            command.compensates, command.compensates_attempts, strict=False
        )
    ]


def _attributes(command: OutboundCommand, resent: bool) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "saga.id": command.saga_id,
        "saga.type": command.saga_type,
        "step": command.step,
        "command.id": command.command_id,
        "command.type": command.command_type,
        "participant": command.participant,
        "attempt": command.attempt,
        "compensation": command.compensation,
    }
    if resent:
        attributes["saga.resent"] = True
    return attributes


@dataclass(slots=True)
class _Open:
    span: Span
    started: float
    saga_id: str
    saga_type: str
    step: str
    attempt: int
    compensation: bool
    #: Its ``flow.held`` event is recorded (once per span).
    held: bool = False


class SagaSpans:
    """The engine's live spans: one per command in flight, keyed by command id.

    Only live sends and applied inputs reach it; a saga rebuilt from history emits
    nothing for what it replays. A command re-sent on recovery gets its span again under
    the same id (marked ``saga.resent``): the first one died with the previous process,
    unexported, or was dropped unexported when the previous owner let the saga go.
    """

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self._open: dict[str, _Open] = {}

    # ------------------------------------------------------------------ the saga span

    def saga_context(
        self, saga_type: str, saga_id: str, caller: Mapping[str, str]
    ) -> dict[str, str]:
        """Chooses the saga span's ids and returns the trace context history stores.

        The parent is ``caller`` (W3C headers that came with the start) or else the
        current span (an admin request's, or the application's around ``Engine.start``).
        The span itself is emitted by ``saga_finished``. When nothing records (no SDK,
        or not sampled), the parent's context is stored as it came.
        """
        context = extract(caller) if caller else otel_context.get_current()
        if not self.telemetry.records:
            # No SDK: the API's probe would be a non-recording span with the parent's
            # context; that context, without the probe (one per start).
            return carrier_of_context(context) or (dict(caller) if caller else {})
        # Started for its ids and sampling decision only; never ended, so never exported.
        probe = self.telemetry.tracer.start_span(
            f"saga {saga_type}", context=context, kind=SpanKind.INTERNAL
        )
        carrier = carrier_of(probe)
        if not carrier:  # the parent's context, handed through
            return dict(caller) if caller else carrier_of_context()
        if not probe.is_recording():
            # Sampled out: its steps must be too, so they continue its (unsampled) context.
            return carrier
        parent = trace.get_current_span(context).get_span_context()
        carrier[SAGA_PARENT] = format(parent.span_id, "016x") if parent.is_valid else ""
        return carrier

    def saga_finished(
        self,
        *,
        saga_type: str,
        saga_id: str,
        trace_context: Mapping[str, str],
        started_at: datetime | None,
        outcome: str,
        error: str | None,
    ) -> None:
        """Emits the saga span, from ``started_at`` (history's) to now, with the ids
        stored at its start. Called after the saga's last command spans ended, so it
        covers them."""
        if SAGA_PARENT not in trace_context:
            return  # nothing was recorded when it started (or an older history)
        own = _saga_context(trace_context)
        if not own.is_valid:
            return
        parent_id = trace_context[SAGA_PARENT]
        if parent_id:
            parent = SpanContext(
                own.trace_id,
                int(parent_id, 16),
                is_remote=True,
                trace_flags=own.trace_flags,
                trace_state=own.trace_state,
            )
            context = trace.set_span_in_context(NonRecordingSpan(parent))
        else:
            context = otel_context.Context()  # a root, whatever span is current here
        start = _ns(started_at) if started_at is not None else time.time_ns()
        with preset_ids(own.span_id, own.trace_id):
            span = self.telemetry.tracer.start_span(
                f"saga {saga_type}",
                context=context,
                kind=SpanKind.INTERNAL,
                attributes={"saga.id": saga_id, "saga.type": saga_type, "outcome": outcome},
                start_time=start,
            )
        if outcome in ("failed", "compensated"):
            span.set_status(StatusCode.ERROR, error or outcome)
        # max(): under a test's virtual clock the start may lie ahead of the wall clock.
        span.end(end_time=max(time.time_ns(), start))

    # ------------------------------------------------------------------ command spans

    def opened(
        self, commands: Iterable[OutboundCommand], *, at: SendTime, resent: bool = False
    ) -> None:
        """Opens the spans of ``commands``, sent at ``at`` (the engine reports its sends
        once they are done). Each command carried its span's context already: both
        derive it from the command (``step_context``), so neither waits for the other."""
        if not self.telemetry.records:
            return  # no SDK: nothing records
        for command in commands:
            # A child's answer to its parent is the parent's step's reply, not a step of
            # its own: the parent's step span covers it.
            if command.participant != PARENT_PARTICIPANT:
                self._open_one(command, at, resent)

    def _open_one(self, command: OutboundCommand, at: SendTime, resent: bool) -> None:
        previous = self._open.get(command.command_id)
        if previous is not None:
            if previous.attempt == command.attempt:
                return  # the same send again (the saga was reloaded here): one span for it
            del self._open[command.command_id]
            self._end(previous, "superseded", record=False)
        with preset_ids(command_span_id(command.command_id, command.attempt)):
            span = self.telemetry.tracer.start_span(
                f"{'compensate' if command.compensation else 'step'} {command.step}",
                context=extract(command.trace_context),
                kind=SpanKind.PRODUCER,
                links=_compensated(command),
                attributes=_attributes(command, resent),
                start_time=at.wall_ns,
            )
        self._open[command.command_id] = _Open(
            span,
            at.perf,
            command.saga_id,
            command.saga_type,
            command.step,
            command.attempt,
            command.compensation,
        )

    def leaving(self, command: OutboundCommand) -> None:
        """``command`` leaves the engine now (its sender publishes it). A command sent at
        once is handed to the sender before its span opens (the engine reports its sends
        once they are done); one whose span is open already was held by flow control
        after its send was reported: its span gets a ``flow.held`` event, now, saying
        for how long (``flow.held_ms``)."""
        opened = self._open.get(command.command_id)
        if opened is None or opened.attempt != command.attempt or opened.held:
            return
        opened.held = True
        held_ms = (time.perf_counter() - opened.started) * 1000
        opened.span.add_event("flow.held", {"flow.held_ms": round(held_ms, 3)})

    def applied(self, saga_id: str, events: Iterable[Event]) -> None:
        """Ends the spans that the committed events answer."""
        if not self._open:
            return  # none open (nothing records, say): no event can end one
        for event in events:
            if type(event) not in _ANSWERS:
                # Most are not answers: tested once here, as isinstance of each struct's
                # class below would be a slow path (msgspec's metaclass) per event.
                continue
            if isinstance(event, ReplyReceived):
                self._finish(event.command_id, event.outcome, error=event.outcome == "failure")
            elif isinstance(event, AttemptTimedOut):
                self._finish(event.command_id, "timeout", error=True)
            elif isinstance(event, InvalidReplyReceived):
                # The send is over (answered); what follows is an operator's, not the step's.
                self._finish(event.command_id, "invalid_reply", error=True)
            elif isinstance(event, StepAbandoned):
                # Given up by the saga's code (a race lost, a timeout scope): no reply
                # will be waited for; its compensation, if any, is a span of its own.
                for command_id in event.command_ids:
                    self._finish(command_id, "abandoned")
            elif isinstance(event, StepSkipped):
                for command_id, opened in list(self._open.items()):
                    if (
                        opened.saga_id == saga_id
                        and opened.step == event.step
                        and opened.compensation == event.compensation
                    ):
                        self._finish(command_id, "skipped")

    def saga_ended(self, saga_id: str, outcome: str) -> None:
        """A terminal saga: what is still open was abandoned (nothing re-sends it)."""
        for command_id, opened in list(self._open.items()):
            if opened.saga_id == saga_id:
                del self._open[command_id]
                self._end(opened, outcome, record=False)

    def superseded(self, saga_id: str, *, keep: set[str]) -> None:
        """The saga was rebuilt from history after another engine changed it: the spans
        of its commands no longer in flight end (answered or abandoned elsewhere)."""
        for command_id, opened in list(self._open.items()):
            if opened.saga_id == saga_id and command_id not in keep:
                del self._open[command_id]
                self._end(opened, "answered_elsewhere", record=False)

    def evicted(self, saga_id: str) -> None:
        """The engine let go of the saga (stale owner, failed write, shut down): its open
        spans are dropped unexported; whoever loads the saga next re-sends what is in
        flight and emits those spans under the same ids."""
        for command_id in [c for c, o in self._open.items() if o.saga_id == saga_id]:
            del self._open[command_id]

    def _finish(self, command_id: str, outcome: str, *, error: bool = False) -> None:
        opened = self._open.pop(command_id, None)
        if opened is not None:
            self._end(opened, outcome, record=True, error=error)

    def _end(self, opened: _Open, outcome: str, *, record: bool, error: bool = False) -> None:
        opened.span.set_attribute("outcome", outcome)
        if error:
            opened.span.set_status(StatusCode.ERROR, outcome)
        opened.span.end()
        if record:
            self.telemetry.step_duration.record(
                time.perf_counter() - opened.started,
                {
                    "saga.type": opened.saga_type,
                    "step": opened.step,
                    "compensation": opened.compensation,
                    "outcome": outcome,
                },
            )

"""OpenTelemetry for the engine and the participant kit, kept at the edge.

The decision core (_runtime, _operations, _events, _context) never imports OpenTelemetry:
the engine calls into this module around its live effects only, never while it rebuilds
a saga from history, so a replay emits no span twice.

One trace per saga: a "saga {type}" span is opened when the saga starts (a child of the
caller's span when a ``traceparent`` came with the start, else a new root) and its W3C
context is what SagaStarted stores. Each command sent opens a "step {name}" or
"compensate {name}" span, child of the saga span; its context is the command's Kafka
``traceparent``, so the participant's "handle {CommandType}" span is its child. The step
span ends when the reply or the timeout is applied.

Without an SDK configured the API's no-op tracer hands the parent's context through, so
the trace context stored and sent is exactly the caller's, as before.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from saga_engine._events import AttemptTimedOut, Event, ReplyReceived, StepSkipped

if TYPE_CHECKING:
    from saga_engine._decision import OutboundCommand

log = logging.getLogger("saga_engine.telemetry")

INSTRUMENTATION = "saga_engine"
_PROPAGATOR = TraceContextTextMapPropagator()

#: Saga lifecycle counters mirrored from ``Engine.stats`` (stat name -> instrument name).
SAGA_COUNTERS = {
    "sagas_started": "saga.started",
    "sagas_completed": "saga.completed",
    "sagas_compensated": "saga.compensated",
    "sagas_failed": "saga.failed",
    "sagas_cancelled": "saga.cancelled",
    "sagas_parked": "saga.parked",
}


def extract(carrier: Mapping[str, str]) -> otel_context.Context:
    """The OTel context of a W3C ``traceparent``/``tracestate`` carrier (maybe empty)."""
    return _PROPAGATOR.extract(dict(carrier))


def carrier_of(span: Span) -> dict[str, str]:
    """The W3C headers of ``span``'s context; empty when it has no valid context."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


class Telemetry:
    """The tracer and the instruments, built from providers (the global ones by default,
    so a test can inject an SDK provider with in-memory exporters)."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.tracer = trace.get_tracer(INSTRUMENTATION, tracer_provider=tracer_provider)
        meter = metrics.get_meter(INSTRUMENTATION, meter_provider=meter_provider)
        self.counters = {
            stat: meter.create_counter(name, unit="{saga}", description=f"Sagas {name[5:]}")
            for stat, name in SAGA_COUNTERS.items()
        }
        self.step_duration = meter.create_histogram(
            "saga.step.duration",
            unit="s",
            description="From sending a step's (or compensation's) command to its reply or timeout",
        )
        self.saga_duration = meter.create_histogram(
            "saga.duration", unit="s", description="From a saga's start to its terminal state"
        )
        self.handle_duration = meter.create_histogram(
            "saga.participant.handle.duration",
            unit="s",
            description="A participant's processing of one command",
        )
        self._sources: weakref.WeakSet[Any] = weakref.WeakSet()
        meter.create_observable_gauge(
            "saga.open",
            callbacks=[self._observe_open],
            unit="{saga}",
            description="Open sagas held in memory by this process's engines, by type",
        )

    def watch(self, engine: Any) -> None:
        """Counts ``engine.open_saga_counts()`` in the ``saga.open`` gauge while it lives."""
        self._sources.add(engine)

    def _observe_open(self, options: CallbackOptions) -> Iterable[Observation]:
        totals: dict[str, int] = {}
        for source in list(self._sources):
            for saga_type, n in source.open_saga_counts().items():
                totals[saga_type] = totals.get(saga_type, 0) + n
        return [Observation(n, {"saga.type": t}) for t, n in sorted(totals.items())]

    def count(self, stat: str, saga_type: str) -> None:
        counter = self.counters.get(stat)
        if counter is not None:
            counter.add(1, {"saga.type": saga_type})

    # ------------------------------------------------------------------ participant side

    @contextmanager
    def consumer_span(
        self,
        command_type: str,
        trace_context: Mapping[str, str],
        attributes: Mapping[str, Any],
    ) -> Iterator[Span]:
        """A "handle {CommandType}" consumer span, child of the command's ``traceparent``,
        made current for the duration of the block."""
        started = time.perf_counter()
        outcome = "error"
        with self.tracer.start_as_current_span(
            f"handle {command_type}",
            context=extract(trace_context),
            kind=SpanKind.CONSUMER,
            attributes={k: v for k, v in attributes.items() if v is not None},
            record_exception=True,
        ) as span:
            try:
                yield span
                outcome = "done"
            finally:
                self.handle_duration.record(
                    time.perf_counter() - started,
                    {"command.type": command_type, "outcome": outcome},
                )


_default: Telemetry | None = None


def default_telemetry() -> Telemetry:
    """One Telemetry on the global providers (proxies: an SDK set later is picked up)."""
    global _default
    if _default is None:
        _default = Telemetry()
    return _default


def configure_from_env(service_name: str = "saga-engine") -> bool:
    """Sets global SDK providers exporting OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT``
    (or the traces/metrics specific variable) is set. Returns whether it did.

    Call it once at process start (``saga worker``, a participant's main), before
    building the worker. The exporter reads the standard OTEL_* variables itself.
    """
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    if not endpoint or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME", service_name)
    resource = Resource.create({"service.name": name}).merge(OTELResourceDetector().detect())
    tracer_provider = SdkTracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    meter_provider = SdkMeterProvider(
        resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())]
    )
    metrics.set_meter_provider(meter_provider)
    log.info("OpenTelemetry: exporting OTLP/HTTP to %s as %s", endpoint, name)
    return True


# --------------------------------------------------------------------------- engine side


@dataclass(slots=True)
class _Open:
    span: Span
    started: float
    saga_id: str
    saga_type: str
    step: str
    compensation: bool


class SagaSpans:
    """The engine's live spans: one per command in flight, keyed by command id.

    Only live sends and applied inputs reach it; a saga rebuilt from history emits
    nothing for what it replays. A command re-sent on recovery gets a new span (marked
    ``saga.resent``); the span of its first send died with the previous process.
    """

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self._open: dict[str, _Open] = {}
        #: The last forward span per (saga id, step), for the compensation's link. Lost
        #: on a crash: a compensation sent by a recovered engine has no link.
        self._forward: dict[tuple[str, str], SpanContext] = {}

    def saga_span(
        self, saga_type: str, saga_id: str, caller: Mapping[str, str]
    ) -> tuple[Span, dict[str, str]]:
        """Opens the "saga {type}" span; returns it and the trace context to store."""
        span = self.telemetry.tracer.start_span(
            f"saga {saga_type}",
            context=extract(caller),
            kind=SpanKind.INTERNAL,
            attributes={"saga.id": saga_id, "saga.type": saga_type},
        )
        return span, carrier_of(span) or dict(caller)

    def sent(self, command: OutboundCommand, *, resent: bool = False) -> OutboundCommand:
        """Opens the span of a command about to be sent; returns the command carrying
        that span's context."""
        previous = self._open.pop(command.command_id, None)
        if previous is not None:
            self._end(previous, "resent", record=False)
        links: list[Link] = []
        if command.compensation:
            forward = self._forward.get((command.saga_id, command.step))
            if forward is not None:
                links.append(Link(forward, {"link.kind": "compensates"}))
        role = "compensate" if command.compensation else "step"
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
        span = self.telemetry.tracer.start_span(
            f"{role} {command.step}",
            context=extract(command.trace_context),
            kind=SpanKind.PRODUCER,
            links=links,
            attributes=attributes,
        )
        self._open[command.command_id] = _Open(
            span,
            time.perf_counter(),
            command.saga_id,
            command.saga_type,
            command.step,
            command.compensation,
        )
        if not command.compensation and span.get_span_context().is_valid:
            self._forward[(command.saga_id, command.step)] = span.get_span_context()
        carrier = carrier_of(span)
        if not carrier:
            return command
        return dataclasses.replace(command, trace_context=carrier)

    def not_sent(self, command_id: str, error: BaseException) -> None:
        opened = self._open.pop(command_id, None)
        if opened is not None:
            opened.span.record_exception(error)
            self._end(opened, "send_failed", record=False, error=True)

    def applied(self, saga_id: str, events: Iterable[Event]) -> None:
        """Ends the spans that the committed events answer."""
        for event in events:
            if isinstance(event, ReplyReceived):
                self._finish(event.command_id, event.outcome, error=event.outcome == "failure")
            elif isinstance(event, AttemptTimedOut):
                self._finish(event.command_id, "timeout", error=True)
            elif isinstance(event, StepSkipped):
                for command_id, opened in list(self._open.items()):
                    if (
                        opened.saga_id == saga_id
                        and opened.step == event.step
                        and opened.compensation == event.compensation
                    ):
                        self._finish(command_id, "skipped")

    def saga_ended(self, saga_id: str, outcome: str) -> None:
        """A terminal saga: what is still open was abandoned; forget its forward spans."""
        self._drop(saga_id, outcome)
        for key in [k for k in self._forward if k[0] == saga_id]:
            del self._forward[key]

    def evicted(self, saga_id: str) -> None:
        """The engine let go of the saga (stale owner, failed write, shut down)."""
        self._drop(saga_id, "interrupted")

    def _drop(self, saga_id: str, outcome: str) -> None:
        for command_id, opened in list(self._open.items()):
            if opened.saga_id == saga_id:
                del self._open[command_id]
                self._end(opened, outcome, record=False)

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

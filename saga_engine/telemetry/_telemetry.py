"""OpenTelemetry for the engine and the participant kit, kept at the edge.

The decision core (_runtime, _state, _inputs, _operations, _events, _context, _view)
never imports OpenTelemetry:
the engine calls into this module around its live effects only, never while it rebuilds
a saga from history, so a replay emits no span twice.

This module holds the providers, the instruments, the participant's consumer span and
the process-level setup (``configure_from_env``, the contrib instrumentations); the
engine's saga, step and compensation spans are in ``_spans``.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Histogram, MeterProvider, Observation
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import (
    INVALID_SPAN,
    NoOpTracer,
    ProxyTracer,
    ProxyTracerProvider,
    Span,
    SpanKind,
    Tracer,
    TracerProvider,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    import httpx
    from fastapi import FastAPI

log = logging.getLogger("saga_engine.telemetry")

INSTRUMENTATION = "saga_engine"
_PROPAGATOR = TraceContextTextMapPropagator()
#: The API's tracers, which record nothing (``Telemetry.records``).
_NOT_RECORDING = (ProxyTracer, NoOpTracer)

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
    """The OTel context of a W3C ``traceparent``/``tracestate`` carrier (maybe empty),
    on a fresh base: nothing of the current context (e.g. a background loop's
    suppression of query spans, below) leaks into the work done for that trace."""
    return _PROPAGATOR.extract(dict(carrier), context=otel_context.Context())


def detach_from_trace(*, suppress_queries: bool = True) -> None:
    """Called first in a long-lived task (a consumer loop, the group-commit writer, the
    reply relay, a timer): it belongs to no caller's trace, whatever span was current
    where it was created. With ``suppress_queries`` the contrib instrumentations
    (asyncpg) record nothing in it either: one of its queries serves many sagas, so a
    span for each would be a trace of its own, noise. Work done for one saga attaches
    that saga's context (``extract``), where instrumentation is on again.
    """
    fresh = otel_context.Context()
    if suppress_queries:
        # The key the contrib instrumentations check (what suppress_instrumentation() sets).
        fresh = otel_context.set_value(otel_context._SUPPRESS_INSTRUMENTATION_KEY, True, fresh)
    otel_context.attach(fresh)  # this task's context only: tasks copy theirs at creation


def carrier_of_context(context: otel_context.Context | None = None) -> dict[str, str]:
    """The W3C headers of ``context`` (the current one by default); empty when it holds
    no valid span context."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=context)
    return carrier


def carrier_from_headers(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, str]:
    """The W3C context of a Kafka record's ``traceparent``/``tracestate`` headers, checked
    and normalised by the propagator (empty when absent or malformed)."""
    raw = {
        key: value.decode("utf-8", errors="replace")
        for key, value in headers
        if key in ("traceparent", "tracestate") and value
    }
    return carrier_of_context(extract(raw)) if raw else {}


def carrier_of(span: Span) -> dict[str, str]:
    """The W3C headers of ``span``'s context; empty when it has no valid context."""
    return carrier_of_context(trace.set_span_in_context(span))


#: (trace id or None, span id) for the span being started in this context.
_PRESET: ContextVar[tuple[int | None, int] | None] = ContextVar(
    "saga_engine_preset_span_ids", default=None
)


class PresetIdGenerator(IdGenerator):
    """Gives the ids set by ``preset_ids`` while it is active, else the wrapped ones.

    Why: a saga's spans must keep their ids across processes (the saga span is emitted by
    whichever engine sees the saga end; a compensation links to the forward step's span
    from history), and the SDK's id generator is its one extension point for that.
    """

    def __init__(self, inner: IdGenerator) -> None:
        self.inner = inner

    def generate_span_id(self) -> int:
        preset = _PRESET.get()
        return preset[1] if preset is not None else self.inner.generate_span_id()

    def generate_trace_id(self) -> int:
        preset = _PRESET.get()
        if preset is not None and preset[0] is not None:
            return preset[0]
        return self.inner.generate_trace_id()

    def is_trace_id_random(self) -> bool:
        return self.inner.is_trace_id_random()


@contextmanager
def preset_ids(span_id: int, trace_id: int | None = None) -> Iterator[None]:
    """Spans started by ``Telemetry.tracer`` in this block get these ids (with the SDK)."""
    token = _PRESET.set((trace_id, span_id))
    try:
        yield
    finally:
        _PRESET.reset(token)


class Telemetry:
    """The tracer and the instruments, built from providers (the global ones by default,
    so a test can inject an SDK provider with in-memory exporters)."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self._proxy = trace.get_tracer(INSTRUMENTATION, tracer_provider=tracer_provider)
        self._tracer: Tracer | None = None
        self._proxy_until = 0.0
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
        self._kafka_instruments(meter)

    def _kafka_instruments(self, meter: metrics.Meter) -> None:
        # Issue 22: a group that keeps rebalancing, and a partition no fetch can read,
        # each stop work without an error anywhere; these make both visible.
        self.rebalances = meter.create_counter(
            "saga.kafka.rebalances",
            unit="{rebalance}",
            description="Consumer-group generations joined by this process's members",
        )
        self._groups: weakref.WeakSet[Any] = weakref.WeakSet()
        meter.create_observable_gauge(
            "saga.kafka.rebalances.per_minute",
            callbacks=[self._observe_rebalances],
            unit="{rebalance}/min",
            description="Generations each group member joined in the last minute",
        )
        self.unreadable_fetches = meter.create_counter(
            "saga.kafka.fetch.unreadable",
            unit="{fetch}",
            description="Fetches that failed for a reason retrying cannot cure (a "
            "compression codec missing, a corrupt batch); the partition is paused",
        )

    @property
    def tracer(self) -> Tracer:
        """The tracer: once an SDK provider is in place, its tracer with a
        ``PresetIdGenerator``; until then the API's proxy (which records nothing)."""
        if self._tracer is None:
            # Asked on every span: while no provider is set, look again at most once a
            # second (the proxy records nothing; a provider set later is picked up).
            now = time.monotonic()
            if now < self._proxy_until:
                return self._proxy
            provider = self.tracer_provider or trace.get_tracer_provider()
            if isinstance(provider, ProxyTracerProvider):
                self._proxy_until = now + 1.0
                return self._proxy
            tracer = provider.get_tracer(INSTRUMENTATION)
            # The SDK hands one tracer per instrumentation scope: ours, so wrapping its
            # id generator changes nothing for anyone else's spans.
            if isinstance(tracer, SdkTracer):
                if not isinstance(tracer.id_generator, PresetIdGenerator):
                    tracer.id_generator = PresetIdGenerator(tracer.id_generator)
            elif not isinstance(tracer, NoOpTracer):
                log.warning(
                    "the tracer provider is not OpenTelemetry's SDK (%s): saga spans "
                    "cannot keep their ids across processes, so a saga's spans may not "
                    "join up into one trace",
                    type(provider).__name__,
                )
            self._tracer = tracer
        return self._tracer

    @property
    def records(self) -> bool:
        """Whether spans can be recorded at all (an SDK provider is in place)."""
        # Asked for every command sent. With no provider when ``tracer`` last looked (it
        # looks again at most once a second) the answer is no, without asking it
        # (bench.instructions); a tuple made once, as ``ProxyTracer | NoOpTracer`` built
        # a union object per call.
        if self._tracer is None and time.monotonic() < self._proxy_until:
            return False
        return not isinstance(self.tracer, _NOT_RECORDING)

    def instrument_app(self, app: FastAPI) -> None:
        """Server spans for ``app`` (the contrib FastAPI instrumentation): a request that
        comes with a ``traceparent`` continues its caller's trace, and a saga started by
        it is a child of its span."""
        try:
            from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
        except ImportError:
            _missing("fastapi")
            return
        FastAPIInstrumentor.instrument_app(
            app,
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            excluded_urls="/health$,/static/",
        )

    def instrument_client(self, client: httpx.AsyncClient) -> None:
        """Client spans for ``client`` (the contrib httpx instrumentation), children of the
        span current when a request is sent; they carry the W3C context to the server."""
        try:
            from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
        except ImportError:
            _missing("httpx")
            return
        HTTPXClientInstrumentor.instrument_client(
            client, tracer_provider=self.tracer_provider, meter_provider=self.meter_provider
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

    def watch_group(self, watch: Any) -> None:
        """Reports ``watch.per_minute()`` (a ``GroupWatch``) in the per-minute gauge."""
        self._groups.add(watch)

    def count_rebalances(self, group: str, n: int) -> None:
        self.rebalances.add(n, {"group": group})

    def count_unreadable(self, topic: str, partition: int) -> None:
        self.unreadable_fetches.add(1, {"topic": topic, "partition": partition})

    def _observe_rebalances(self, options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(w.per_minute(), {"group": w.group, "member": w.member})
            for w in list(self._groups)
        ]

    def count(self, stat: str, saga_type: str) -> None:
        counter = self.counters.get(stat)
        if counter is not None:
            counter.add(1, {"saga.type": saga_type})

    # ------------------------------------------------------------------ participant side

    def consumer_span(
        self,
        command_type: str,
        trace_context: Mapping[str, str],
        attributes: Mapping[str, Any],
    ) -> AbstractContextManager[Span]:
        """A "handle {CommandType}" consumer span, child of the command's ``traceparent``,
        made current for the duration of the block; its duration recorded either way.
        With no SDK there is no span to make (``INVALID_SPAN``), and the reply carries
        the command's own context (``carrier_of(INVALID_SPAN)`` is empty)."""
        if not self.records:
            return HandleTimer(self.handle_duration, command_type)
        return self._recorded_span(command_type, trace_context, attributes)

    @contextmanager
    def _recorded_span(
        self,
        command_type: str,
        trace_context: Mapping[str, str],
        attributes: Mapping[str, Any],
    ) -> Iterator[Span]:
        with (
            HandleTimer(self.handle_duration, command_type),
            self._handle_span(command_type, trace_context, attributes) as span,
        ):
            yield span

    @contextmanager
    def _handle_span(
        self,
        command_type: str,
        trace_context: Mapping[str, str],
        attributes: Mapping[str, Any],
    ) -> Iterator[Span]:
        # The command's context becomes the whole current context (not merged into the
        # consumer loop's, whose suppression of query spans must not reach the handler).
        token = otel_context.attach(extract(trace_context))
        try:
            with self.tracer.start_as_current_span(
                f"handle {command_type}",
                kind=SpanKind.CONSUMER,
                attributes={k: v for k, v in attributes.items() if v is not None},
                record_exception=True,
            ) as span:
                yield span
        finally:
            otel_context.detach(token)


class HandleTimer:
    """A participant's processing of one command measured (``handle_duration``, by
    command type and outcome: ``done``, or ``error`` when the block raised). A class
    rather than a generator: with no SDK it is all ``consumer_span`` makes per command."""

    __slots__ = ("_command_type", "_histogram", "_started")

    def __init__(self, histogram: Histogram, command_type: str) -> None:
        self._histogram = histogram
        self._command_type = command_type
        self._started = 0.0

    def __enter__(self) -> Span:
        self._started = time.perf_counter()
        return INVALID_SPAN

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self._histogram.record(
            time.perf_counter() - self._started,
            {"command.type": self._command_type, "outcome": "done" if kind is None else "error"},
        )


_warned: set[str] = set()


def _missing(library: str) -> None:
    if library not in _warned:
        _warned.add(library)
        log.info(
            "no spans for %s: install saga-engine[instrumentation] for the contrib "
            "instrumentations",
            library,
        )


def instrument_asyncpg(tracer_provider: TracerProvider | None = None) -> None:
    """A span for every asyncpg query in this process, a child of the current span (the
    contrib instrumentation patches asyncpg's connection class: it is process-wide, so
    it is set up once, at the edge, never by a library object). Idempotent."""
    try:
        from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
    except ImportError:
        _missing("asyncpg")
        return
    instrumentor = AsyncPGInstrumentor()  # type: ignore[no-untyped-call]  # untyped upstream
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=tracer_provider)


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
    building the worker. The exporter reads the standard OTEL_* variables itself. It also
    turns on the asyncpg instrumentation (process-wide); the FastAPI apps and httpx
    clients the engine builds are instrumented through their ``Telemetry``.
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
    instrument_asyncpg()
    log.info("OpenTelemetry: exporting OTLP/HTTP to %s as %s", endpoint, name)
    return True

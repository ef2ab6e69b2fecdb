"""One saga across the engine and two participant PROCESSES is one connected trace.

The engine runs here with an ``InMemorySpanExporter``; the participants run as their own
processes, set up like any service (``configure_from_env``: OTLP/HTTP export and the
asyncpg instrumentation) and export to a receiver in this test. The saga is started
through the admin API under a client span, so the trace goes: client -> admin request
(FastAPI instrumentation) -> saga -> steps -> the participants' handle spans -> their
queries (asyncpg instrumentation), and for the HTTP step: step -> httpx client span ->
the service's request span (FastAPI instrumentation, in the other process).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, Settings
from saga_engine.settings import (
    AdminSettings,
    EngineSettings,
    HttpSettings,
    KafkaSettings,
    PostgresSettings,
)
from saga_engine.telemetry import Telemetry, instrument_asyncpg
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.integration.test_http_and_triggers import serve
from tests.telemetry.otlp_sink import ExportedSpan, OtlpSink
from tests.telemetry.traced_participant import Charge, Reserve
from tests.waiting import eventually

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SERVER, CLIENT, PRODUCER, CONSUMER = 2, 3, 4, 5  # OTLP span kinds


class Order(BaseModel):
    n: int = 1


class Done(BaseModel):
    score: int


class Risk(BaseModel):
    score: int


class Checkout(Saga[Order, Done]):
    name = "traced-checkout"

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        await ctx.step("reserve", to="stock", command=Reserve(n=input.n))
        risk = await ctx.http_step(
            "risk", endpoint="risk", path="/risk", json={"n": input.n}, returns=Risk
        )
        await ctx.step("charge", to="payments", command=Charge(n=input.n))
        return Done(score=risk.score)


@pytest.fixture
def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> Settings:
    return Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=kafka_bootstrap,
            topic_prefix=f"t{unique_id}",
            group_id=f"engines-{unique_id}",
            partitions=1,
        ),
        engine=EngineSettings(),
        admin=AdminSettings(enabled=True, port=0),
    )


@contextlib.asynccontextmanager
async def participant_processes(
    settings: Settings, pg: PgTarget, sink_url: str, logs: Path
) -> AsyncIterator[dict[str, int]]:
    """Starts stock and payments; yields each one's HTTP port once both consume."""
    conn = await asyncpg.connect(pg.database_dsn)
    try:
        for name in ("stock", "payments"):
            await conn.execute(f'CREATE SCHEMA "{pg.schema}_{name}"')
    finally:
        await conn.close()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name in ("stock", "payments"):
            procs[name] = _spawn(name, settings, pg, sink_url, logs)
        ports = {name: await _ready(proc, logs / f"{name}.log") for name, proc in procs.items()}
        yield ports
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                await asyncio.to_thread(proc.wait, 20)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait, 10)
        conn = await asyncpg.connect(pg.database_dsn)
        try:
            for name in ("stock", "payments"):
                await conn.execute(f'DROP SCHEMA IF EXISTS "{pg.schema}_{name}" CASCADE')
        finally:
            await conn.close()


def _spawn(
    name: str, settings: Settings, pg: PgTarget, sink_url: str, logs: Path
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SAGA_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "SAGA_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
        "SAGA_KAFKA__PARTITIONS": "1",
        "SAGA_PARTICIPANT__DSN": pg.database_dsn,
        "SAGA_PARTICIPANT__DB_SCHEMA": f"{pg.schema}_{name}",
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink_url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export spans within 0.1 s
        "OTEL_METRIC_EXPORT_INTERVAL": "600000",
    }
    with open(logs / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "tests.telemetry.traced_participant", name],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )


async def _ready(proc: subprocess.Popen[bytes], log: Path) -> int:
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
    except TimeoutError:
        line = b""
    if not line.startswith(b"ready "):
        tail = (await asyncio.to_thread(log.read_text))[-3000:]
        raise AssertionError(f"participant did not start: {line!r}\n{tail}")
    return int(line.split()[1])


def _exported(span: ReadableSpan) -> ExportedSpan:
    assert span.context is not None
    return ExportedSpan(
        service="engine",
        name=span.name,
        kind=span.kind.value + 1,  # the SDK's enum counts from 0, OTLP's from 1
        trace_id=format(span.context.trace_id, "032x"),
        span_id=format(span.context.span_id, "016x"),
        parent=format(span.parent.span_id, "016x") if span.parent else "",
        start_ns=span.start_time or 0,
        attributes=dict(span.attributes or {}),
    )


@contextlib.contextmanager
def asyncpg_traced(provider: TracerProvider) -> Iterator[None]:
    """The asyncpg instrumentation in this process, for this test only."""
    instrument_asyncpg(provider)
    try:
        yield
    finally:
        AsyncPGInstrumentor().uninstrument()  # type: ignore[no-untyped-call]


def _is_query(span: ExportedSpan) -> bool:
    return "db.system" in span.attributes or "db.system.name" in span.attributes


async def test_one_saga_is_one_connected_trace_across_processes(
    settings: Settings, pg: PgTarget, tmp_path: Path
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(provider)
    sink = OtlpSink()

    async with (
        serve(sink.app()) as sink_url,
        participant_processes(settings, pg, sink_url, tmp_path) as ports,
    ):
        engine_settings = settings.model_copy(
            update={
                "http": HttpSettings(endpoints={"risk": f"http://127.0.0.1:{ports['payments']}"})
            }
        )
        worker = SagaWorker(engine_settings, [Checkout], telemetry=telemetry)
        with asyncpg_traced(provider):
            await worker.start()
            # From here on every span belongs to the saga's trace: the background loops
            # (inbox, group commit, relay, consumers) make none of their own.
            quiet_from = time.time_ns()
            try:
                headers: dict[str, str] = {}
                with provider.get_tracer("test").start_as_current_span("client checkout"):
                    inject(headers)
                    async with httpx.AsyncClient(base_url=worker.admin_url or "") as http:
                        response = await http.post(
                            "/sagas/traced-checkout?wait=60", json={"n": 3}, headers=headers
                        )
                assert response.status_code == 200, response.text
                detail = response.json()
                assert detail["status"] == "completed", detail
                assert detail["output"] == {"score": 6}
                saga_id = detail["saga_id"]

                def collected() -> list[ExportedSpan]:
                    return [_exported(s) for s in exporter.get_finished_spans()] + list(sink.spans)

                def complete(spans: list[ExportedSpan]) -> bool:
                    names = {(s.service, s.name) for s in spans}
                    return {
                        ("engine", "saga traced-checkout"),
                        ("stock", "handle Reserve"),
                        ("payments", "handle Charge"),
                        ("payments", "POST /risk"),
                    } <= names and any(s.service == "stock" and _is_query(s) for s in spans)

                # The participants export in the background: wait for their spans.
                spans = await eventually(collected, until=complete, what="every service's spans")
            finally:
                await worker.stop()

    (client,) = [s for s in spans if s.name == "client checkout"]
    trace = [s for s in spans if s.trace_id == client.trace_id]
    by_id = {s.span_id: s for s in trace}
    assert len(by_id) == len(trace), "two spans share an id"
    strays = [s for s in spans if s.trace_id != client.trace_id and s.start_ns >= quiet_from]
    assert strays == [], [(s.service, s.name) for s in strays]
    # Every span the saga made, in any process, is in this one trace.
    assert all(s in trace for s in spans if s.attributes.get("saga.id") == saga_id)

    def one(service: str, name: str) -> ExportedSpan:
        found = [s for s in trace if s.service == service and s.name == name]
        assert len(found) == 1, (service, name, [(s.service, s.name) for s in trace])
        return found[0]

    def parent(span: ExportedSpan) -> ExportedSpan:
        assert span.parent in by_id, f"{span.service}/{span.name}: parent not in the trace"
        return by_id[span.parent]

    # Connected: every span but the client's has its parent in the trace.
    for span in trace:
        if span is not client:
            parent(span)

    request = one("engine", "POST /sagas/{saga}")
    assert request.kind == SERVER
    assert parent(request) == client
    saga = one("engine", "saga traced-checkout")
    assert parent(saga) == request
    assert saga.attributes["saga.id"] == saga_id
    assert saga.attributes["outcome"] == "completed"
    steps = {name: one("engine", f"step {name}") for name in ("reserve", "risk", "charge")}
    for step in steps.values():
        assert parent(step) == saga
        assert step.kind == PRODUCER

    reserve = one("stock", "handle Reserve")
    assert (reserve.kind, parent(reserve)) == (CONSUMER, steps["reserve"])
    charge = one("payments", "handle Charge")
    assert (charge.kind, parent(charge)) == (CONSUMER, steps["charge"])

    # The HTTP step: the engine's httpx client span, then the service's request span.
    (call,) = [s for s in trace if s.service == "engine" and s.kind == CLIENT and not _is_query(s)]
    assert parent(call) == steps["risk"]
    served = one("payments", "POST /risk")
    assert (served.kind, parent(served)) == (SERVER, call)

    # The participants' queries (asyncpg instrumentation) are children of their handling.
    for service, handle in (("stock", reserve), ("payments", charge)):
        queries = [s for s in trace if s.service == service and _is_query(s)]
        assert queries, f"no query spans from {service}"
        assert all(parent(q) == handle for q in queries)
        assert any(
            "INSERT INTO ledger"
            in str(q.attributes.get("db.statement", q.attributes.get("db.query.text", "")))
            for q in queries
        )

"""Engine spans and metrics on in-memory adapters: parents, links, and no duplicate span
for what a recovering engine replays from history."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Settings
from saga_engine._clock import VirtualClock
from saga_engine._engine import Engine
from saga_engine._events import SagaStarted
from saga_engine._memstore import InMemoryEventStore
from saga_engine._telemetry import Telemetry
from saga_engine.testing import InMemoryCommandBus


class Order(BaseModel):
    n: int = 1


class Done(BaseModel):
    ok: bool = True


class Cmd(BaseModel):
    n: int


class Undo(BaseModel):
    n: int


class Three(Saga[Order, Done]):
    name = "three-steps"

    async def run(self, ctx: SagaContext, input: Order) -> Done:
        await ctx.step("a", to="alpha", command=Cmd(n=input.n), compensate=Undo(n=input.n))
        await ctx.step("b", to="beta", command=Cmd(n=input.n), compensate=Undo(n=input.n))
        await ctx.step("c", to="gamma", command=Cmd(n=input.n))
        return Done()


class World:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.telemetry = Telemetry(provider, MeterProvider(metric_readers=[self.reader]))
        self.store = InMemoryEventStore()
        self.bus = InMemoryCommandBus()
        self.clock = VirtualClock()

    def engine(self) -> Engine:
        return Engine(
            Settings(),
            sagas=[Three],
            store=self.store,
            sender=self.bus,
            clock=self.clock,
            telemetry=self.telemetry,
        )

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    async def answer(self, engine: Engine, step: str, outcome: str = "success") -> None:
        command = next(c for c in reversed(self.bus.sent) if c.step == step)
        await engine.reply(command.saga_id, command.command_id, outcome, {})

    def metrics(self) -> dict[str, Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        found: dict[str, Any] = {}
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    found[metric.name] = metric.data
        return found


@pytest.fixture
def world() -> World:
    return World()


def _counter(world: World, name: str) -> int:
    data = world.metrics().get(name)
    return 0 if data is None else sum(int(p.value) for p in data.data_points)


async def test_one_trace_with_step_spans_under_the_saga_span(world: World) -> None:
    engine = world.engine()
    saga_id = await engine.start(Three, Order())
    (open_now,) = world.metrics()["saga.open"].data_points
    assert open_now.value == 1
    assert open_now.attributes == {"saga.type": "three-steps"}
    for step in ("a", "b", "c"):
        await world.answer(engine, step)
    assert (await engine.get(saga_id)).status is SagaStatus.COMPLETED

    (root,) = world.spans("saga three-steps")
    assert root.parent is None
    assert root.context is not None
    steps = [world.spans(f"step {s}")[0] for s in ("a", "b", "c")]
    for span in steps:
        assert span.context is not None
        assert span.parent is not None
        assert span.context.trace_id == root.context.trace_id
        assert span.parent.span_id == root.context.span_id
        assert span.attributes is not None
        assert span.attributes["saga.id"] == saga_id
        assert span.attributes["outcome"] == "success"
        assert span.attributes["attempt"] == 1
    # The trace context stored in history is the saga span's; the commands carry the
    # step spans' contexts.
    started = (await engine.history(saga_id))[0]
    assert isinstance(started, SagaStarted)
    stored = started.trace_context
    assert stored["traceparent"].split("-")[2] == format(root.context.span_id, "016x")
    sent_a = next(c for c in world.bus.sent if c.step == "a")
    assert sent_a.trace_context["traceparent"].split("-")[2] == format(
        steps[0].context.span_id,
        "016x",
    )

    assert _counter(world, "saga.started") == 1
    assert _counter(world, "saga.completed") == 1
    names = set(world.metrics())
    assert {"saga.step.duration", "saga.duration"} <= names


async def test_a_caller_traceparent_makes_the_saga_part_of_its_trace(world: World) -> None:
    engine = world.engine()
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    await engine.start(Three, Order(), trace_context={"traceparent": caller})
    (root,) = world.spans("saga three-steps")
    assert root.parent is not None
    assert root.context is not None
    assert format(root.context.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert format(root.parent.span_id, "016x") == "00f067aa0ba902b7"


async def test_compensation_span_links_to_the_forward_step(world: World) -> None:
    engine = world.engine()
    saga_id = await engine.start(Three, Order())
    await world.answer(engine, "a")
    await world.answer(engine, "b", "failure")
    await world.answer(engine, "a")  # the compensation of a
    assert (await engine.get(saga_id)).status is SagaStatus.COMPENSATED

    (forward,) = world.spans("step a")
    (undo,) = world.spans("compensate a")
    assert undo.attributes is not None
    assert undo.attributes["compensation"] is True
    assert [link.context.span_id for link in undo.links] == [forward.context.span_id]
    (failed,) = world.spans("step b")
    assert failed.attributes is not None
    assert failed.attributes["outcome"] == "failure"
    assert _counter(world, "saga.compensated") == 1


async def test_recovery_after_a_crash_does_not_emit_finished_step_spans_again(
    world: World,
) -> None:
    first = world.engine()
    saga_id = await first.start(Three, Order())
    await world.answer(first, "a")
    await world.answer(first, "b")
    assert [s.name for s in world.spans() if s.name.startswith("step")] == ["step a", "step b"]
    # The process dies with step c in flight: the engine is dropped, never closed.
    del first

    second = world.engine()
    assert await second.recover() == 1
    # Replaying a and b emitted nothing; c, re-sent under the same id, got a new span.
    await world.answer(second, "c")
    assert (await second.get(saga_id)).status is SagaStatus.COMPLETED
    names = [s.name for s in world.spans() if s.name.startswith("step")]
    assert names == ["step a", "step b", "step c"]
    (c,) = world.spans("step c")
    assert c.attributes is not None
    assert c.attributes["saga.resent"] is True
    (root,) = world.spans("saga three-steps")
    assert c.parent is not None
    assert root.context is not None
    assert c.parent.span_id == root.context.span_id  # from the stored trace context
    assert len(world.spans("saga three-steps")) == 1

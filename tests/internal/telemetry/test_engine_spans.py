"""Engine spans and metrics on in-memory adapters: one saga span covering the saga's life,
parents, links (also after a recovery), and no duplicate span for what a recovering
engine replays from history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NoOpTracerProvider
from pydantic import BaseModel

from saga_engine import Saga, SagaContext, SagaStatus, Settings
from saga_engine.core.history._events import SagaStarted
from saga_engine.kernel._settings import FlowLimit, LimitsSettings
from saga_engine.runner._clock import Clock, SystemClock, VirtualClock
from saga_engine.runner._engine import Engine
from saga_engine.store._memstore import InMemoryEventStore
from saga_engine.telemetry._telemetry import Telemetry
from saga_engine.testing import InMemoryCommandBus
from tests.waiting import eventually


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
    def __init__(self, clock: Clock | None = None) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.telemetry = Telemetry(provider, MeterProvider(metric_readers=[self.reader]))
        self.store = InMemoryEventStore()
        self.bus = InMemoryCommandBus()
        self.clock = clock or SystemClock()

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

    def assert_unique_span_ids(self) -> None:
        ids = [s.context.span_id for s in self.spans() if s.context is not None]
        assert len(ids) == len(set(ids)), [s.name for s in self.spans()]

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
    assert world.spans("saga three-steps") == []  # emitted when the saga ends
    for step in ("a", "b", "c"):
        await world.answer(engine, step)
    assert (await engine.get(saga_id)).status is SagaStatus.COMPLETED

    (root,) = world.spans("saga three-steps")
    assert root.parent is None
    assert root.context is not None
    assert root.attributes is not None
    assert (root.attributes["saga.id"], root.attributes["outcome"]) == (saga_id, "completed")
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
        # The saga span covers the saga's whole life, every step inside it.
        assert root.start_time is not None
        assert span.start_time is not None
        assert root.end_time is not None
        assert span.end_time is not None
        assert root.start_time <= span.start_time
        assert span.end_time <= root.end_time
    # The trace context stored in history is the saga span's; the commands carry the
    # step spans' contexts.
    started = (await engine.history(saga_id))[0]
    assert isinstance(started, SagaStarted)
    stored = started.trace_context
    assert stored["traceparent"].split("-")[2] == format(root.context.span_id, "016x")
    assert stored["saga-parent"] == ""  # the root of its trace
    sent_a = next(c for c in world.bus.sent if c.step == "a")
    assert sent_a.trace_context["traceparent"].split("-")[2] == format(
        steps[0].context.span_id,
        "016x",
    )
    assert "saga-parent" not in sent_a.trace_context
    world.assert_unique_span_ids()

    assert _counter(world, "saga.started") == 1
    assert _counter(world, "saga.completed") == 1
    names = set(world.metrics())
    assert {"saga.step.duration", "saga.duration"} <= names


async def test_a_caller_traceparent_makes_the_saga_part_of_its_trace(world: World) -> None:
    engine = world.engine()
    caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    saga_id = await engine.start(Three, Order(), trace_context={"traceparent": caller})
    started = (await engine.history(saga_id))[0]
    assert isinstance(started, SagaStarted)
    assert started.trace_context["saga-parent"] == "00f067aa0ba902b7"
    for step in ("a", "b", "c"):
        await world.answer(engine, step)
    (root,) = world.spans("saga three-steps")
    assert root.parent is not None
    assert root.context is not None
    assert format(root.context.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert format(root.parent.span_id, "016x") == "00f067aa0ba902b7"
    for span in world.spans():
        assert span.context is not None
        assert format(span.context.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"


async def test_without_an_sdk_the_callers_context_is_stored_and_sent_as_it_came() -> None:
    telemetry = Telemetry(NoOpTracerProvider())
    bus = InMemoryCommandBus()
    engine = Engine(
        Settings(), sagas=[Three], store=InMemoryEventStore(), sender=bus, telemetry=telemetry
    )
    caller = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    saga_id = await engine.start(Three, Order(), trace_context=caller)
    started = (await engine.history(saga_id))[0]
    assert isinstance(started, SagaStarted)
    assert started.trace_context == caller
    (sent,) = bus.sent
    assert sent.trace_context == caller


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
    (root,) = world.spans("saga three-steps")
    assert root.attributes is not None
    assert root.attributes["outcome"] == "compensated"
    assert root.status.is_ok is False
    assert _counter(world, "saga.compensated") == 1


async def test_the_compensation_link_survives_a_crash(world: World) -> None:
    first = world.engine()
    saga_id = await first.start(Three, Order())
    await world.answer(first, "a")
    del first  # dies with step b in flight

    second = world.engine()
    assert await second.recover() == 1
    await world.answer(second, "b", "failure")
    await world.answer(second, "a")  # the compensation of a, sent by the second engine
    assert (await second.get(saga_id)).status is SagaStatus.COMPENSATED

    (forward,) = world.spans("step a")  # emitted by the first engine
    (undo,) = world.spans("compensate a")  # by the second
    assert forward.context is not None
    assert [link.context.span_id for link in undo.links] == [forward.context.span_id]
    assert undo.links[0].context.trace_id == forward.context.trace_id
    world.assert_unique_span_ids()


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
    # One saga span, emitted by the engine that saw the end, under the ids the first
    # engine chose and stored: the parent of the steps sent by both engines.
    (root,) = world.spans("saga three-steps")
    assert root.context is not None
    for span in world.spans():
        if span.name.startswith("step"):
            assert span.parent is not None
            assert span.parent.span_id == root.context.span_id
    (a,) = world.spans("step a")
    assert root.start_time is not None
    assert a.start_time is not None
    assert root.start_time <= a.start_time  # its start is the saga's, from history
    world.assert_unique_span_ids()


async def test_a_saga_let_go_and_reloaded_emits_each_send_once(world: World) -> None:
    engine = world.engine()
    saga_id = await engine.start(Three, Order())
    engine.evict(saga_id)  # e.g. its partition moved away and back
    await world.answer(engine, "a")  # reloads the saga from history, re-sends a
    await world.answer(engine, "b")
    await world.answer(engine, "c")
    assert (await engine.get(saga_id)).status is SagaStatus.COMPLETED
    assert [s.name for s in world.spans() if s.name.startswith("step")] == [
        "step a",
        "step b",
        "step c",
    ]
    world.assert_unique_span_ids()


async def _nothing() -> None:
    return None


async def test_the_compensation_link_names_each_forward_attempt_after_a_crash() -> None:
    clock = VirtualClock(datetime.now(UTC))
    world = World(clock)
    first = world.engine()
    saga_id = await first.start(Three, Order())
    await world.answer(first, "a", "retryable")  # not applied: the retry gets a new id
    await clock.advance(timedelta(minutes=10), settle=_nothing)  # its back-off passes
    retried = [c for c in world.bus.sent if c.step == "a"]
    assert [c.attempt for c in retried] == [1, 2]
    assert retried[0].command_id != retried[1].command_id
    await world.answer(first, "a")
    del first  # dies with b in flight

    second = world.engine()
    assert await second.recover() == 1
    await world.answer(second, "b", "failure")
    await world.answer(second, "a")  # the compensation, sent by the second engine
    assert (await second.get(saga_id)).status is SagaStatus.COMPENSATED
    forwards = world.spans("step a")
    assert len(forwards) == 2
    (undo,) = world.spans("compensate a")
    # Both sends may have been applied (the first was only answered "retryable"), so the
    # compensation links to each; their ids come from history, command id and attempt.
    assert {link.context.span_id for link in undo.links} == {
        s.context.span_id for s in forwards if s.context is not None
    }
    world.assert_unique_span_ids()


async def test_a_failed_send_is_emitted_once_when_it_is_sent_again(world: World) -> None:
    engine = world.engine()
    saga_id = await engine.start(Three, Order())
    world.bus.closed = True
    # a's reply is recorded and answered; sending b fails, and the engine sends it again
    # later by reloading the saga (one saga's failed send holds no one else's input).
    await world.answer(engine, "a")
    world.bus.closed = False
    assert await engine.recover() == 1  # b is re-sent under its id
    await world.answer(engine, "b")
    await world.answer(engine, "c")
    assert (await engine.get(saga_id)).status is SagaStatus.COMPLETED
    (b,) = world.spans("step b")
    assert b.attributes is not None
    assert b.attributes["outcome"] == "success"
    world.assert_unique_span_ids()


async def test_a_sampled_out_saga_keeps_its_steps_in_its_trace() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    bus = InMemoryCommandBus()
    engine = Engine(
        Settings(),
        sagas=[Three],
        store=InMemoryEventStore(),
        sender=bus,
        telemetry=Telemetry(provider),
    )
    saga_id = await engine.start(Three, Order())
    started = (await engine.history(saga_id))[0]
    assert isinstance(started, SagaStarted)
    stored = started.trace_context["traceparent"]
    assert int(stored.split("-")[3], 16) & 1 == 0  # a trace of its own, not sampled
    assert "saga-parent" not in started.trace_context  # no saga span is owed
    (sent,) = bus.sent
    # The step continues the saga's trace, unsampled, instead of starting one of its own.
    assert sent.trace_context["traceparent"].split("-")[1] == stored.split("-")[1]
    assert exporter.get_finished_spans() == ()


async def test_a_command_held_by_flow_control_gets_a_flow_held_event(world: World) -> None:
    """The second saga's first command waits for the first's permit (concurrency 1 at
    "alpha"): its span opens when the engine reports the send and gets a ``flow.held``
    event when it actually leaves; the first one's, sent at once, gets none."""
    settings = Settings(limits=LimitsSettings(participants={"alpha": FlowLimit(concurrency=1)}))
    engine = Engine(
        settings,
        sagas=[Three],
        store=world.store,
        sender=world.bus,
        clock=world.clock,
        telemetry=world.telemetry,
    )
    first = await engine.start(Three, Order(n=1))
    second = await engine.start(Three, Order(n=2))
    await eventually(lambda: [c.saga_id for c in world.bus.sent] == [first])
    await world.answer(engine, "a")  # the first's "a": its permit is given back
    await eventually(
        lambda: [c.saga_id for c in world.bus.sent if c.step == "a"] == [first, second]
    )
    command = next(c for c in world.bus.sent if c.saga_id == second)
    await engine.reply(second, command.command_id, "success", {})
    spans = {s.attributes["saga.id"]: s for s in world.spans("step a") if s.attributes}
    assert [e.name for e in spans[first].events] == []
    (held,) = spans[second].events
    assert held.name == "flow.held"
    assert held.attributes is not None
    assert isinstance(held.attributes["flow.held_ms"], float)
    await engine.close()

"""A group that keeps rebalancing is visible (issue 22 §1): the per-minute metric, one
WARNING naming the group and the member, and a degraded health while it lasts."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint

from saga_engine.telemetry._groupwatch import WARN_AFTER, GroupWatch
from saga_engine.telemetry._health import HealthBoard
from saga_engine.telemetry._telemetry import Telemetry


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _points(reader: InMemoryMetricReader, name: str) -> dict[tuple[Any, ...], Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        tuple(sorted((p.attributes or {}).items())): p.value
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.data.data_points
        if isinstance(p, NumberDataPoint)
    }


def _watch_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The watch's own records: another test's leftovers (asyncio's "Task was destroyed"
    when a finished test's task is collected here) are not the watch speaking."""
    return [r for r in caplog.records if r.name == "saga_engine.kafka"]


def test_a_member_that_keeps_rejoining_is_warned_about_counted_and_degrades_health(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    coordinator = SimpleNamespace(generation=-1, member_id="")
    clock, health = Clock(), HealthBoard()
    watch = GroupWatch(
        SimpleNamespace(_coordinator=coordinator),
        group="seats-group",
        member="host-0",
        on_rebalances=telemetry.count_rebalances,
        health=health,
        clock=clock,
    )
    telemetry.watch_group(watch)
    caplog.set_level(logging.WARNING, logger="saga_engine.kafka")

    # A normal start: joined at generation 2. Nothing to say.
    coordinator.generation, coordinator.member_id = 2, "host-0-abc"
    watch.sample()
    assert watch.per_minute() == 1
    assert health.status == "ok"
    assert not _watch_records(caplog)

    # A storm: the generation climbs by dozens between two samples a second apart.
    for _ in range(3):
        clock.now += 1
        coordinator.generation += 10
        watch.sample()
    assert watch.per_minute() == 31 > WARN_AFTER
    assert watch.total == 31
    [warning] = _watch_records(caplog)  # once a minute, not once a sample
    assert warning.levelno == logging.WARNING
    assert "seats-group" in warning.getMessage()
    assert "host-0 (host-0-abc)" in warning.getMessage()
    assert health.status == "degraded"
    assert "seats-group" in health.problems[0]
    assert _points(reader, "saga.kafka.rebalances") == {(("group", "seats-group"),): 31}
    assert _points(reader, "saga.kafka.rebalances.per_minute") == {
        (("group", "seats-group"), ("member", "host-0")): 31
    }

    # Settled: a minute later nothing new; the health is clear again.
    clock.now += 61
    watch.sample()
    assert watch.per_minute() == 0
    assert health.status == "ok"


def test_a_generation_reset_is_not_counted_as_rebalances() -> None:
    coordinator = SimpleNamespace(generation=5, member_id="m")
    watch = GroupWatch(SimpleNamespace(_coordinator=coordinator), group="g", member="m")
    watch.sample()
    coordinator.generation = -1  # aiokafka resets it after an error, before rejoining
    watch.sample()
    coordinator.generation = 6
    watch.sample()
    assert watch.total == 2
    # A consumer not started yet (no coordinator) counts nothing.
    idle = GroupWatch(SimpleNamespace(), group="g", member="m")
    idle.sample()
    assert idle.total == 0

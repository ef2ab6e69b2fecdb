"""Operator metrics: open sagas by status, the oldest parked saga, dead letters.

Served as JSON, or in the Prometheus text format (version 0.0.4) when the client asks
for ``text/plain`` or OpenMetrics, as a Prometheus scraper does.
"""

from __future__ import annotations

import re

from saga_engine.admin._flow import flow_gates
from saga_engine.admin._schemas import FlowGate, MetricsBody
from saga_engine.core.history._status import SagaStatus
from saga_engine.runner._parts import EngineParts
from saga_engine.store._store import as_utc

OPEN_STATUSES = tuple(s for s in SagaStatus if s.is_open)
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def collect(parts: EngineParts) -> MetricsBody:
    """Two indexed queries (counts of open sagas, the oldest parked one), whatever the
    number of sagas stored."""
    summary = await parts.store.open_summary()
    by_status = {s.value: summary.by_status.get(s, 0) for s in OPEN_STATUSES}
    age = None
    if summary.oldest_parked_at is not None:
        now = as_utc(parts.clock.now())
        age = max(0.0, (now - as_utc(summary.oldest_parked_at)).total_seconds())
    counters = {name: int(value) for name, value in sorted(parts.stats.counts.items())}
    return MetricsBody(
        open_sagas=by_status,
        open_total=sum(by_status.values()),
        oldest_stuck_age_seconds=age,
        dead_lettered=counters.get("dead_lettered", 0),
        counters=counters,
        flow=flow_gates(parts),
    )


def wants_text(accept: str | None) -> bool:
    """Prometheus asks for OpenMetrics or text/plain; browsers and tools get JSON."""
    if not accept:
        return False
    accept = accept.lower()
    if "application/json" in accept:
        return False
    return "text/plain" in accept or "openmetrics" in accept


_NAME = re.compile(r"[^a-zA-Z0-9_]")


def _metric_name(counter: str) -> str:
    name = _NAME.sub("_", counter).strip("_") or "unnamed"
    return f"saga_engine_{name}_total"


def render_prometheus(body: MetricsBody) -> str:
    lines = [
        "# HELP saga_open_sagas Open sagas by status.",
        "# TYPE saga_open_sagas gauge",
    ]
    lines += [f'saga_open_sagas{{status="{s}"}} {n}' for s, n in sorted(body.open_sagas.items())]
    lines += [
        "# HELP saga_oldest_stuck_age_seconds Seconds since the longest-parked saga last changed "
        "(0 when none is parked).",
        "# TYPE saga_oldest_stuck_age_seconds gauge",
        f"saga_oldest_stuck_age_seconds {body.oldest_stuck_age_seconds or 0.0}",
        "# HELP saga_dead_lettered_total Messages this engine sent to the dead-letter topic.",
        "# TYPE saga_dead_lettered_total counter",
        f"saga_dead_lettered_total {body.dead_lettered}",
    ]
    lines += _flow_lines(body)
    seen: set[str] = set()
    for counter, value in body.counters.items():
        name = _metric_name(counter)
        if name in seen:
            continue
        seen.add(name)
        lines += [
            f"# HELP {name} The engine counter {_NAME.sub('_', counter)}.",
            f"# TYPE {name} counter",
            f"{name} {value}",
        ]
    return "\n".join(lines) + "\n"


def _gate_labels(gate: FlowGate) -> str:
    """The labels of a limit's series: its kind, name and flow policy."""
    return f'kind="{gate.kind}",name="{_label(gate.name)}",policy="{gate.policy}"'


def _flow_lines(body: MetricsBody) -> list[str]:
    """Flow control's gauges, one series per limit (none when flow control is off)."""
    if not body.flow:
        return []
    lines: list[str] = []
    for metric, help_text, field in (
        ("saga_flow_in_flight", "Commands sent and not yet answered, per limit.", "in_flight"),
        ("saga_flow_waiting", "Commands recorded and held back, per limit.", "waiting"),
        (
            "saga_flow_concurrency_limit",
            "This engine's share of the concurrency limit.",
            "effective_concurrency",
        ),
        (
            "saga_flow_policy_share",
            "The flow policy's share of the limit (1 where no other policy limits its name).",
            "policy_share",
        ),
    ):
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for gate in body.flow:
            value = getattr(gate, field)
            if value is not None:
                lines.append(f"{metric}{{{_gate_labels(gate)}}} {value}")
    for metric, help_text, field in (
        (
            "saga_flow_budget_in_use",
            "What the commands in flight hold of a budget (the sum of their costs), per "
            "limit and resource.",
            "budget_in_use",
        ),
        (
            "saga_flow_budget",
            "This engine's share of a budget, per limit and resource.",
            "effective_budget",
        ),
    ):
        budgeted = [gate for gate in body.flow if getattr(gate, field)]
        if not budgeted:
            continue
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge"]
        for gate in budgeted:
            labels = _gate_labels(gate)
            for resource, amount in sorted(getattr(gate, field).items()):
                lines.append(f'{metric}{{{labels},resource="{resource}"}} {amount}')
    return lines + _adaptive_lines(body)


def _adaptive_lines(body: MetricsBody) -> list[str]:
    """An adaptive limit's value, labelled with why it last moved."""
    adaptive = [gate for gate in body.flow if gate.adaptive is not None]
    if not adaptive:
        return []
    metric = "saga_flow_adaptive_limit"
    lines = [
        f"# HELP {metric} An adaptive concurrency limit's value now, per limit; cause: why "
        "it last moved (start, latency_held, latency_rose, timeout, probe, bounds).",
        f"# TYPE {metric} gauge",
    ]
    for gate in adaptive:
        assert gate.adaptive is not None
        lines.append(
            f'{metric}{{{_gate_labels(gate)},cause="{gate.adaptive.cause}"}} {gate.adaptive.limit}'
        )
    return lines


def _label(value: str) -> str:
    """A Prometheus label's value, escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"')

"""The admin API's insights per saga type (``GET /saga-types/{name}/insights``): the
observed graph, per-node and per-type figures and the SLA, from the aggregates the store
keeps (``core/views/_insights``, migration 0014): a read of a window's buckets, never a scan
of the events.

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from saga_engine.admin._deps import PartsDep
from saga_engine.admin._route_helpers import READ_ERRORS, errors
from saga_engine.admin._schemas import Edge, GraphNodeInfo
from saga_engine.core.views._graph_view import declared_graph, graph_insight
from saga_engine.core.views._insight_report import build_report, maybe_over
from saga_engine.core.views._insights import GRAIN, WINDOWS, bucket_of
from saga_engine.kernel._input_types import StorableText
from saga_engine.kernel._serde import JsonDict
from saga_engine.runner._parts import EngineParts
from saga_engine.store._insight_store import InsightStore

__all__ = ["InsightsBody", "insights_report", "router"]

router = APIRouter()

Window = Literal["1h", "1d", "7d"]


class Percentiles(BaseModel):
    p50: int | None = Field(description="ms; the upper bound of the histogram bucket.")
    p95: int | None
    p99: int | None


class NodeError(BaseModel):
    message: str
    count: int


class PhaseTiming(BaseModel):
    samples: int = Field(description="Replies that measured this phase.")
    mean_ms: float | None
    p50: int | None = Field(description="ms; the upper bound of the histogram bucket.")
    p95: int | None
    p99: int | None


class LearnedCostBody(BaseModel):
    samples: int = Field(description="Replies that reported the handler's times.")
    handler_ms: float = Field(description="The handler's mean wall-clock time.")
    handler_p95_ms: int | None
    cpu_ms: float | None = Field(description="The handler's mean CPU time (the Python kit's).")
    cpu_samples: int


class NodeInsight(BaseModel):
    name: str = Field(
        description="The step, `child:NAME`, `sleep:N`, `signal:NAME`, `event:SOURCE`."
    )
    kind: Literal["step", "child", "timer", "signal", "event"]
    runs: int = Field(description="Runs that took this node.")
    share: float | None = Field(description="The share of the window's runs that took it.")
    attempts: int
    successes: int
    attempts_per_success: float | None
    refusal_rate: float | None = Field(description="Refusals per attempt.")
    timeout_rate: float | None = Field(description="Timed-out attempts per attempt.")
    compensation_rate: float | None = Field(description="Compensations per run that took it.")
    latency_ms: Percentiles = Field(description="From command to reply (waits: to the input).")
    errors: list[NodeError] = Field(description="The most frequent error messages.")
    timings_ms: dict[str, PhaseTiming] = Field(
        default_factory=dict,
        description="Where a step's time went, from its replies' timing headers (PROTOCOL.md "
        "7.4a), by phase in order: held (by flow control: issued to sent), to_participant "
        "(sent to received), waiting (received to the handler's start), handler, commit (the "
        "handler's end to its transaction's commit), back (committed to the engine reading the "
        "reply), apply (read to its event stored); and cpu (the handler's CPU time). A phase "
        "no reply measured is absent.",
    )
    learned_cost: LearnedCostBody | None = Field(
        default=None,
        description="What the step costs its participant, learnt from its handler's times.",
    )


class Parallel(BaseModel):
    nodes: list[str] = Field(description="Two nodes that ran at the same time (`gather`).")
    runs: int
    share: float | None


class SlaInsight(BaseModel):
    seconds: float
    within: int
    breached: int
    share_within: float | None
    breaching_runs: list[str] = Field(description="The latest runs that breached it.")


class GraphNodeInsight(GraphNodeInfo):
    attempts: int = Field(description="The commands it sent in the window (a fan-out: its items').")
    successes: int
    latency_ms: Percentiles = Field(description="From command to reply (a fan-out: each item's).")


class GraphInsight(BaseModel):
    nodes: list[GraphNodeInsight] = Field(description="The declared graph, in its order.")
    edges: list[Edge] = Field(description="Each [dependency, dependent].")


class InsightsBody(BaseModel):
    saga_type: str
    window: Window
    since: datetime
    until: datetime
    runs: int = Field(description="Runs that ended in the window.")
    throughput_per_minute: float
    outcomes: dict[str, int]
    duration_ms: Percentiles
    sla: SlaInsight | None = Field(description="With `sla = timedelta(...)` on the class.")
    nodes: list[NodeInsight] = Field(description="The observed graph, in the order nodes start.")
    parallel: list[Parallel]
    graph: GraphInsight | None = Field(
        default=None,
        description="A graph saga's declared graph, each node's figures over the window; "
        "null for a saga written as code.",
    )


async def insights_report(parts: EngineParts, name: str, window: str) -> JsonDict:
    """The insights document of saga type ``name`` over ``window`` (UnknownSagaType: 404):
    a graph saga's with its declared graph, each node's latency from its rows."""
    definition = parts.registry.get(name)
    sla = definition.cls.sla
    until = bucket_of(parts.clock.now()) + GRAIN
    since = until - WINDOWS[window]
    store = parts.store
    rows = await store.insight_rows(name, since, until) if isinstance(store, InsightStore) else []
    report = build_report(name, window, since, until, rows, sla)
    graph = declared_graph(definition)
    report["graph"] = None if graph is None else graph_insight(graph, rows)
    if not isinstance(store, InsightStore):
        return report
    # Only when some run may have breached it (by the histogram): the query walks the
    # window's ended runs, latest first, until it has found enough.
    if sla is not None and maybe_over(rows, sla):
        report["sla"]["breaching_runs"] = await store.sla_breaches(name, since, until, sla)
    return report


@router.get(
    "/saga-types/{name}/insights",
    response_model=InsightsBody,
    responses=errors(404, *READ_ERRORS),
    tags=["insights"],
)
async def insights(
    parts: PartsDep,
    name: Annotated[Annotated[str, StorableText(max_length=200)], Path()],
    window: Annotated[Window, Query(description="The last hour, day or week.")] = "1h",
) -> InsightsBody:
    """A saga type's observed graph over a window (by when runs ended): per node the
    runs that took it, latency percentiles, attempts per success, refusal, timeout and
    compensation rates and the most frequent errors; per type the throughput, duration
    percentiles, outcomes and, with an SLA, the share within it and the runs that
    breached it. Read from aggregates the engine keeps as runs end."""
    return InsightsBody.model_validate(await insights_report(parts, name, window))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


async def prometheus_lines(parts: EngineParts) -> list[str]:
    """The last hour's insights of every registered type as Prometheus gauges: runs,
    per-node latency quantiles (ms, the histogram's bucket bounds) and, for a type with
    an SLA, the runs that breached it. Cluster-wide (read from the aggregates): one
    indexed read per type per scrape."""
    if not isinstance(parts.store, InsightStore):
        return []
    reports = [await insights_report(parts, name, "1h") for name in sorted(parts.registry.names())]
    runs = [
        "# HELP saga_insight_runs Runs that ended in the last hour, by type and outcome.",
        "# TYPE saga_insight_runs gauge",
    ]
    latency = [
        "# HELP saga_insight_node_latency_ms Latency of each node in the last hour "
        "(command to reply), by quantile.",
        "# TYPE saga_insight_node_latency_ms gauge",
    ]
    breaches = [
        "# HELP saga_insight_sla_breached Runs that ended in the last hour past their type's SLA.",
        "# TYPE saga_insight_sla_breached gauge",
    ]
    for r in reports:
        t = _label(r["saga_type"])
        runs += [
            f'saga_insight_runs{{saga_type="{t}",outcome="{o}"}} {n}'
            for o, n in r["outcomes"].items()
        ]
        for node in r["nodes"]:
            for q, v in node["latency_ms"].items():
                if v is not None:
                    latency.append(
                        f'saga_insight_node_latency_ms{{saga_type="{t}",node="{_label(node["name"])}",'
                        f'quantile="0.{q[1:]}"}} {v}'
                    )
        if r["sla"] is not None:
            breaches.append(f'saga_insight_sla_breached{{saga_type="{t}"}} {r["sla"]["breached"]}')
    return runs + latency + breaches

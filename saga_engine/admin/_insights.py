"""The admin API's insights per saga type (``GET /saga-types/{name}/insights``): the
observed graph, per-node and per-type figures and the SLA, from the aggregates the store
keeps (``core/views/_insights``, migration 0014): a read of a window's buckets, never a scan
of the events. Split by flow policy (migration 0017): ``?flow_policy=N`` reads one
policy's runs, and ``GET /saga-types/{name}/insights/policies`` puts every policy that ran
in the window side by side.

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
from saga_engine.core.views._insight_report import (
    build_report,
    compare_policies,
    maybe_over,
    policy_runs,
)
from saga_engine.core.views._insights import GRAIN, WINDOWS, bucket_of
from saga_engine.kernel._input_types import StorableText
from saga_engine.kernel._serde import JsonDict
from saga_engine.kernel._settings import POLICY_VERSIONS
from saga_engine.runner._parts import EngineParts
from saga_engine.store._insight_store import InsightStore

__all__ = [
    "FlowPolicyQuery",
    "InsightsBody",
    "PolicyComparisonBody",
    "insights_report",
    "policy_comparison",
    "router",
]

router = APIRouter()

Window = Literal["1h", "1d", "7d"]
#: The saga type a route reads, and the window it reads.
TypeName = Annotated[Annotated[str, StorableText(max_length=200)], Path()]
WindowQuery = Annotated[Window, Query(description="The last hour, day or week.")]
#: ``?flow_policy=N``: one flow policy's runs (absent: every policy's).
FlowPolicyQuery = Annotated[
    int | None,
    Query(
        ge=POLICY_VERSIONS.start,
        le=POLICY_VERSIONS.stop - 1,
        description="Only the runs started under this flow policy (absent: every policy's).",
    ),
]


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
        description="The step, `child:NAME`, `sleep:N`, `signal:NAME`, `event:SOURCE`, "
        "`callback:NAME`."
    )
    kind: Literal["step", "child", "timer", "signal", "event", "callback"]
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


class FlowPolicyRuns(BaseModel):
    version: int = Field(description="The flow policy (`LimitsSettings.policies`; 1: its own).")
    runs: int = Field(description="Runs started under it that ended in the window.")
    share: float | None = Field(description="Their share of the window's runs.")


class InsightsBody(BaseModel):
    saga_type: str
    window: Window
    since: datetime
    until: datetime
    flow_policy: int | None = Field(
        default=None,
        description="The flow policy these figures are of (`?flow_policy=`); null: every "
        "policy's runs.",
    )
    flow_policies: list[FlowPolicyRuns] = Field(
        default_factory=list,
        description="Every flow policy whose runs ended in the window, with its runs, "
        "whichever `flow_policy` the figures are of.",
    )
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


class PolicyNode(BaseModel):
    name: str
    kind: Literal["step", "child", "timer", "signal", "event", "callback"]
    runs: int = Field(description="Runs of this policy that took this node.")
    share: float | None
    attempts_per_success: float | None
    refusal_rate: float | None
    timeout_rate: float | None
    latency_ms: Percentiles = Field(description="From command to reply (waits: to the input).")
    held_ms: PhaseTiming | None = Field(
        description="The time flow control held its commands (issued to sent), from its "
        "replies' timing headers; null when no reply measured it."
    )


class PolicyFigures(BaseModel):
    version: int = Field(description="The flow policy.")
    runs: int = Field(description="Runs started under it that ended in the window.")
    share: float | None = Field(description="Their share of the window's runs.")
    throughput_per_minute: float
    outcomes: dict[str, int]
    duration_ms: Percentiles
    sla_share_within: float | None = Field(
        description="The share of its runs within the type's SLA; null without an SLA."
    )
    nodes: list[PolicyNode] = Field(description="Its observed graph, in the order nodes start.")


class PolicyComparisonBody(BaseModel):
    saga_type: str
    window: Window
    since: datetime
    until: datetime
    runs: int = Field(description="Runs that ended in the window, every policy's.")
    policies: list[PolicyFigures] = Field(
        description="Each flow policy whose runs ended in the window, by version."
    )


def _window(parts: EngineParts, window: str) -> tuple[datetime, datetime]:
    """[since, until) of ``window``: whole buckets, up to the end of the current one."""
    until = bucket_of(parts.clock.now()) + GRAIN
    return until - WINDOWS[window], until


async def insights_report(
    parts: EngineParts, name: str, window: str, flow_policy: int | None = None
) -> JsonDict:
    """The insights document of saga type ``name`` over ``window`` (UnknownSagaType: 404),
    of the runs started under ``flow_policy`` (None: every policy's), with the policies
    that ran in the window: a graph saga's with its declared graph, each node's latency
    from its rows."""
    definition = parts.registry.get(name)
    sla = definition.cls.sla
    since, until = _window(parts, window)
    store = parts.store
    if isinstance(store, InsightStore):
        rows = await store.insight_rows(name, since, until, flow_policy)
        policies = await store.insight_policies(name, since, until)
    else:
        rows, policies = [], {}
    report = build_report(name, window, since, until, rows, sla)
    report["flow_policy"] = flow_policy
    report["flow_policies"] = policy_runs(policies)
    graph = declared_graph(definition)
    report["graph"] = None if graph is None else graph_insight(graph, rows)
    if not isinstance(store, InsightStore):
        return report
    # Only when some run may have breached it (by the histogram): the query walks the
    # window's ended runs, latest first, until it has found enough.
    if sla is not None and maybe_over(rows, sla):
        report["sla"]["breaching_runs"] = await store.sla_breaches(
            name, since, until, sla, flow_policy=flow_policy
        )
    return report


async def policy_comparison(parts: EngineParts, name: str, window: str) -> JsonDict:
    """Each flow policy's figures of saga type ``name`` over ``window``, side by side
    (UnknownSagaType: 404): one read of the policies that ran, then one per policy."""
    sla = parts.registry.get(name).cls.sla
    since, until = _window(parts, window)
    store = parts.store
    reports: dict[int, JsonDict] = {}
    if isinstance(store, InsightStore):
        for version in await store.insight_policies(name, since, until):
            rows = await store.insight_rows(name, since, until, version)
            reports[version] = build_report(name, window, since, until, rows, sla)
    return compare_policies(name, window, since, until, reports)


@router.get(
    "/saga-types/{name}/insights",
    response_model=InsightsBody,
    responses=errors(404, *READ_ERRORS),
    tags=["insights"],
)
async def insights(
    parts: PartsDep,
    name: TypeName,
    window: WindowQuery = "1h",
    flow_policy: FlowPolicyQuery = None,
) -> InsightsBody:
    """A saga type's observed graph over a window (by when runs ended): per node the
    runs that took it, latency percentiles, attempts per success, refusal, timeout and
    compensation rates and the most frequent errors; per type the throughput, duration
    percentiles, outcomes and, with an SLA, the share within it and the runs that
    breached it. Read from aggregates the engine keeps as runs end. Of every flow
    policy's runs, or with `flow_policy` of that policy's only; `flow_policies` lists the
    policies that ran in the window."""
    return InsightsBody.model_validate(await insights_report(parts, name, window, flow_policy))


@router.get(
    "/saga-types/{name}/insights/policies",
    response_model=PolicyComparisonBody,
    responses=errors(404, *READ_ERRORS),
    tags=["insights"],
)
async def insights_by_policy(
    parts: PartsDep,
    name: TypeName,
    window: WindowQuery = "1h",
) -> PolicyComparisonBody:
    """A saga type's figures over a window per flow policy, side by side: for each
    policy whose runs ended in the window, its runs and their share, outcomes, duration
    percentiles, the SLA's share and, per node, its latency and the time flow control
    held its commands. To compare a policy rolled out to a share of sagas with the
    others before giving it every saga."""
    return PolicyComparisonBody.model_validate(await policy_comparison(parts, name, window))


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

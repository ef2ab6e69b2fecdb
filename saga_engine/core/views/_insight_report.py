"""A saga type's insights over a window, from its aggregate rows (``_insights``).

Percentiles come from the fixed histograms: a percentile is the upper bound of the
bucket it falls in (so "p95 <= 200 ms"), and the SLA share counts the buckets below the
SLA whole and the bucket holding it pro rata. A report is of every flow policy's runs or
of one policy's; a comparison puts each policy's figures side by side (``compare_policies``).
Pure: the store reads the rows, the admin API serves what this returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from saga_engine.core.views._insights import BOUNDS_MS, CPU, PHASES, Counters
from saga_engine.kernel._serde import JsonDict

_QUANTILES: Final = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))
#: The most frequent error messages shown per node.
TOP_ERRORS: Final = 5


def percentiles(hist: list[int]) -> dict[str, int | None]:
    """p50/p95/p99 in ms: each the upper bound of its bucket (the top bucket: its lower
    bound), None without observations."""
    total = sum(hist)
    out: dict[str, int | None] = {}
    for label, q in _QUANTILES:
        if total == 0:
            out[label] = None
            continue
        target, seen = q * total, 0
        for i, n in enumerate(hist):
            seen += n
            if seen >= target:
                out[label] = BOUNDS_MS[min(i, len(BOUNDS_MS) - 1)]
                break
    return out


def count_within_limit(hist: list[int], limit_ms: float) -> float:
    """How many observations were at most ``limit_ms`` (the bucket holding it pro rata)."""
    count, lower = 0.0, 0.0
    for i, n in enumerate(hist):
        upper = float(BOUNDS_MS[i]) if i < len(BOUNDS_MS) else float("inf")
        if upper <= limit_ms:
            count += n
        elif lower < limit_ms and upper != float("inf"):
            count += n * (limit_ms - lower) / (upper - lower)
        lower = upper
    return count


def maybe_over(rows: Iterable[tuple[str, str, str, Counters]], limit: timedelta) -> int:
    """Runs (the "type" rows' durations) in buckets reaching above ``limit``: those that
    may have taken longer."""
    ms = limit.total_seconds() * 1000
    return sum(
        n
        for facet, _, _, c in rows
        if facet == "type"
        for i, n in enumerate(c.hist)
        if i >= len(BOUNDS_MS) or BOUNDS_MS[i] > ms
    )


@dataclass(frozen=True, slots=True)
class LearnedCost:
    """What one step of a saga type costs its participant, learnt from the handler
    times its replies reported (PROTOCOL.md 7.4a) over a window: the estimate a
    scheduler may use where the step declares no cost."""

    saga_type: str
    step: str
    #: The replies that reported the handler's times.
    samples: int
    #: The handler's mean wall-clock time, and its 95th percentile (the histogram's
    #: bucket bound), in ms.
    handler_ms: float
    handler_p95_ms: int | None
    #: The handler's mean CPU time in ms (None: no reply reported it; the Go kit does not).
    cpu_ms: float | None = None
    cpu_samples: int = 0

    def as_dict(self) -> JsonDict:
        return {
            "samples": self.samples,
            "handler_ms": self.handler_ms,
            "handler_p95_ms": self.handler_p95_ms,
            "cpu_ms": self.cpu_ms,
            "cpu_samples": self.cpu_samples,
        }


def _mean_ms(c: Counters) -> float | None:
    return round(c.total_us / c.runs / 1000, 3) if c.runs else None


def learned_costs(
    saga_type: str, rows: Iterable[tuple[str, str, str, Counters]]
) -> dict[str, LearnedCost]:
    """Each step's learned cost from a window's rows (``InsightStore.insight_rows``), by
    step; a step none of whose replies reported its handler's times has none."""
    handler: dict[str, Counters] = {}
    cpu: dict[str, Counters] = {}
    for facet, key, detail, c in rows:
        if facet == "phase" and detail in ("handler", CPU):
            (handler if detail == "handler" else cpu).setdefault(key, Counters()).add(c)
    out: dict[str, LearnedCost] = {}
    for step, h in sorted(handler.items()):
        mean = _mean_ms(h)
        if mean is None:
            continue
        used = cpu.get(step)
        out[step] = LearnedCost(
            saga_type,
            step,
            h.runs,
            mean,
            percentiles(h.hist)["p95"],
            _mean_ms(used) if used is not None else None,
            used.runs if used is not None else 0,
        )
    return out


def _phase_figures(c: Counters) -> JsonDict:
    return {"samples": c.runs, "mean_ms": _mean_ms(c), **percentiles(c.hist)}


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def build_report(
    saga_type: str,
    window: str,
    since: datetime,
    until: datetime,
    rows: Iterable[tuple[str, str, str, Counters]],
    sla: timedelta | None = None,
) -> JsonDict:
    """The insights document (see docs/operations.md, "Insights")."""
    outcomes: dict[str, int] = {}
    durations = Counters()
    nodes: dict[str, tuple[str, Counters]] = {}
    errors: dict[str, dict[str, int]] = {}
    overlaps: dict[tuple[str, str], int] = {}
    phases: dict[str, dict[str, Counters]] = {}
    rows = list(rows)
    for facet, key, detail, c in rows:
        if facet == "type":
            outcomes[key] = outcomes.get(key, 0) + c.runs
            durations.add(c)
        elif facet == "node":
            nodes.setdefault(key, (detail, Counters()))[1].add(c)
        elif facet == "error":
            mine = errors.setdefault(key, {})
            mine[detail] = mine.get(detail, 0) + c.runs
        elif facet == "overlap":
            overlaps[(key, detail)] = overlaps.get((key, detail), 0) + c.runs
        elif facet == "phase":
            phases.setdefault(key, {}).setdefault(detail, Counters()).add(c)
    runs = durations.runs
    costs = learned_costs(saga_type, rows)
    minutes = max((until - since).total_seconds() / 60, 1e-9)
    return {
        "saga_type": saga_type,
        "window": window,
        "since": since.isoformat(),
        "until": until.isoformat(),
        "runs": runs,
        "throughput_per_minute": round(runs / minutes, 3),
        "outcomes": dict(sorted(outcomes.items())),
        "duration_ms": percentiles(durations.hist),
        "sla": _sla(durations.hist, runs, sla),
        "nodes": [
            {
                **_node(name, kind, c, runs, errors.get(name, {})),
                "timings_ms": {
                    phase: _phase_figures(p)
                    for phase in (*PHASES, CPU)
                    if (p := phases.get(name, {}).get(phase)) is not None
                },
                "learned_cost": costs[name].as_dict() if name in costs else None,
            }
            for name, (kind, c) in sorted(nodes.items(), key=_order)
        ],
        "parallel": [
            {"nodes": [a, b], "runs": n, "share": _rate(n, runs)}
            for (a, b), n in sorted(overlaps.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
    }


def _order(item: tuple[str, tuple[str, Counters]]) -> tuple[float, float, str]:
    """Nodes in the order they start, on average (then their rank in their runs)."""
    name, (_, c) = item
    runs = max(c.runs, 1)
    return (c.offset_ms / runs, c.rank_sum / runs, name)


def _sla(hist: list[int], runs: int, sla: timedelta | None) -> JsonDict | None:
    if sla is None:
        return None
    ok = count_within_limit(hist, sla.total_seconds() * 1000) if runs else 0.0
    return {
        "seconds": sla.total_seconds(),
        "within": round(ok),
        "breached": runs - round(ok),
        "share_within": _rate(round(ok), runs),
        "breaching_runs": [],
    }


def _node(name: str, kind: str, c: Counters, runs: int, errors: dict[str, int]) -> JsonDict:
    top: list[Any] = sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_ERRORS]
    return {
        "name": name,
        "kind": kind,
        "runs": c.runs,
        "share": _rate(c.runs, runs),
        "attempts": c.attempts,
        "successes": c.successes,
        "attempts_per_success": _rate(c.attempts, c.successes),
        "refusal_rate": _rate(c.refusals, c.attempts),
        "timeout_rate": _rate(c.timeouts, c.attempts),
        "compensation_rate": _rate(c.compensations, c.runs),
        "latency_ms": percentiles(c.hist),
        "errors": [{"message": m, "count": n} for m, n in top],
    }


# ------------------------------------------------------------------ flow policies


def policy_runs(policies: Mapping[int, int]) -> list[JsonDict]:
    """The flow policies a window's runs were started under (``insight_policies``), each
    with its runs and their share of the window's, by version."""
    total = sum(policies.values())
    return [
        {"version": v, "runs": n, "share": _rate(n, total)} for v, n in sorted(policies.items())
    ]


def compare_policies(
    saga_type: str,
    window: str,
    since: datetime,
    until: datetime,
    reports: Mapping[int, JsonDict],
) -> JsonDict:
    """Each flow policy's figures side by side, from its report (``build_report`` of that
    policy's rows), by version: its runs and their share, outcomes, durations, the SLA's
    share and, per node, its latency and the time flow control held its commands."""
    total = sum(r["runs"] for r in reports.values())
    return {
        "saga_type": saga_type,
        "window": window,
        "since": since.isoformat(),
        "until": until.isoformat(),
        "runs": total,
        "policies": [_policy_line(v, r, total) for v, r in sorted(reports.items())],
    }


def _policy_line(version: int, report: JsonDict, total: int) -> JsonDict:
    sla = report["sla"]
    return {
        "version": version,
        "runs": report["runs"],
        "share": _rate(report["runs"], total),
        "throughput_per_minute": report["throughput_per_minute"],
        "outcomes": report["outcomes"],
        "duration_ms": report["duration_ms"],
        "sla_share_within": None if sla is None else sla["share_within"],
        "nodes": [
            {
                "name": n["name"],
                "kind": n["kind"],
                "runs": n["runs"],
                "share": n["share"],
                "attempts_per_success": n["attempts_per_success"],
                "refusal_rate": n["refusal_rate"],
                "timeout_rate": n["timeout_rate"],
                "latency_ms": n["latency_ms"],
                "held_ms": n["timings_ms"].get("held"),
            }
            for n in report["nodes"]
        ],
    }


def nodes_by_policy(comparison: JsonDict) -> list[tuple[str, list[JsonDict | None]]]:
    """A comparison's nodes, each with its line per policy (in the comparison's order;
    None where that policy's runs never took it): the nodes in the order the first
    policy's start, then those only later policies took."""
    lines: dict[str, list[JsonDict | None]] = {}
    policies = comparison["policies"]
    for i, p in enumerate(policies):
        for n in p["nodes"]:
            lines.setdefault(n["name"], [None] * len(policies))[i] = n
    return list(lines.items())

"""``saga insights NAME``: a saga type's insights, through its engine's admin API (``GET
/saga-types/{name}/insights``): throughput, outcomes, durations, the SLA, and per node of
the observed graph its share of runs, latency percentiles, retries, refusals, timeouts,
compensations and most frequent error. ``--flow-policy N``: one flow policy's runs;
``--by-policy``: every flow policy's figures side by side (``GET
/saga-types/{name}/insights/policies``)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer

from saga_engine.cli._common import (
    AdminUrl,
    JsonOpt,
    admin_call,
    fail,
    make_table,
    out,
    print_json,
)
from saga_engine.core.views._insight_report import nodes_by_policy

__all__ = ["commands"]

#: Added to the ``saga`` app without a name: ``saga insights``.
commands = typer.Typer()


def _ms(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:g}s" if value >= 1000 else f"{value}ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


@commands.command("insights")
def insights(
    name: Annotated[str, typer.Argument(help="The saga type.")],
    window: Annotated[
        str, typer.Option("--window", help="The last 1h, 1d or 7d (by when runs ended).")
    ] = "1h",
    flow_policy: Annotated[
        int | None,
        typer.Option("--flow-policy", help="Only the runs started under this flow policy."),
    ] = None,
    by_policy: Annotated[
        bool, typer.Option("--by-policy", help="Each flow policy's figures side by side.")
    ] = False,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """A saga type's observed graph and figures over a window (of every flow policy's
    runs, of one, or each policy's side by side)."""
    if by_policy and flow_policy is not None:
        fail("--by-policy compares every flow policy: leave out --flow-policy")
    path = f"/saga-types/{quote(name, safe='')}/insights"
    params = [("window", window)]
    if by_policy:
        path += "/policies"
    elif flow_policy is not None:
        params.append(("flow_policy", str(flow_policy)))
    body: dict[str, Any] = admin_call(admin_url, lambda api: api.get(path, params=params))
    if as_json:
        print_json(body)
    elif by_policy:
        _comparison(body)
    else:
        _report(body)


def _outcomes(outcomes: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in outcomes.items()) or "none"


def _report(body: dict[str, Any]) -> None:
    d = body["duration_ms"]
    policy = body.get("flow_policy")
    under = "" if policy is None else f" under flow policy {policy}"
    out.print(
        f"{body['saga_type']}: {body['runs']} runs{under} ended in the last {body['window']} "
        f"({body['throughput_per_minute']}/min); {_outcomes(body['outcomes'])}; "
        f"duration p50 {_ms(d['p50'])} p95 {_ms(d['p95'])} p99 {_ms(d['p99'])}"
    )
    policies = body.get("flow_policies") or []
    if len(policies) > 1 or (policies and policy is not None):
        ran = ", ".join(f"{p['version']}: {p['runs']} runs" for p in policies)
        out.print(f"flow policies in the window: {ran} (compare them: --by-policy)")
    sla = body["sla"]
    if sla is not None:
        out.print(
            f"SLA {sla['seconds']:g}s: {_pct(sla['share_within'])} within, {sla['breached']} "
            f"breached; latest: {' '.join(sla['breaching_runs']) or '-'}"
        )
    rows = [
        (
            n["name"],
            n["kind"],
            str(n["runs"]),
            _pct(n["share"]),
            _ms(n["latency_ms"]["p50"]),
            _ms(n["latency_ms"]["p95"]),
            _ms(n["latency_ms"]["p99"]),
            str(n["attempts_per_success"] or "-"),
            _pct(n["refusal_rate"]),
            _pct(n["timeout_rate"]),
            _pct(n["compensation_rate"]),
            n["errors"][0]["message"] if n["errors"] else "",
        )
        for n in body["nodes"]
    ]
    columns = (
        "node",
        "kind",
        "runs",
        "share",
        "p50",
        "p95",
        "p99",
        "tries/ok",
        "refused",
        "timed out",
        "compensated",
        "top error",
    )
    out.print(make_table("nodes, in the order they start", columns, rows, "ellipsis"))
    _timings(body["nodes"])
    for p in body["parallel"]:
        out.print(f"parallel: {p['nodes'][0]} | {p['nodes'][1]} in {_pct(p['share'])} of runs")


#: The phases of a step's time, in order (PROTOCOL.md 7.4a), and the handler's CPU time.
_PHASES = ("held", "to_participant", "waiting", "handler", "commit", "back", "apply", "cpu")


def _mean(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.3g}s" if value >= 1000 else f"{value:.3g}ms"


def _timings(nodes: list[dict[str, Any]]) -> None:
    """Where each step's time went (the means of its replies' timing headers) and its
    learned cost: only for nodes whose replies reported timings."""
    timed = [n for n in nodes if n.get("timings_ms")]
    if not timed:
        return
    rows = []
    for n in timed:
        cost = n.get("learned_cost")
        learned = "-"
        if cost is not None:
            learned = _mean(cost["handler_ms"])
            if cost["cpu_ms"] is not None:
                learned += f" (cpu {_mean(cost['cpu_ms'])})"
        phases = n["timings_ms"]
        rows.append(
            (
                n["name"],
                *(_mean(phases[p]["mean_ms"]) if p in phases else "-" for p in _PHASES),
                learned,
            )
        )
    columns = ("node", *(p.replace("_", " ") for p in _PHASES), "learned cost")
    out.print(make_table("where the time goes (mean per reply)", columns, rows, "ellipsis"))


def _comparison(body: dict[str, Any]) -> None:
    """Each flow policy's figures, then each node's p99 latency and held p99 per policy."""
    policies = body["policies"]
    out.print(
        f"{body['saga_type']}: {body['runs']} runs ended in the last {body['window']}, "
        f"by flow policy"
    )
    if not policies:
        return
    rows = [
        (
            str(p["version"]),
            str(p["runs"]),
            _pct(p["share"]),
            _outcomes(p["outcomes"]),
            _ms(p["duration_ms"]["p50"]),
            _ms(p["duration_ms"]["p95"]),
            _ms(p["duration_ms"]["p99"]),
            _pct(p["sla_share_within"]),
        )
        for p in policies
    ]
    columns = ("policy", "runs", "share", "outcomes", "p50", "p95", "p99", "within SLA")
    out.print(make_table("flow policies", columns, rows, "ellipsis"))
    node_rows = [
        (
            name,
            *(
                cell
                for n in lines
                for cell in (
                    _ms(n["latency_ms"]["p99"]) if n else "-",
                    _ms(n["held_ms"]["p99"]) if n and n["held_ms"] else "-",
                )
            ),
        )
        for name, lines in nodes_by_policy(body)
    ]
    node_columns = (
        "node",
        *(c for p in policies for c in (f"p99 ({p['version']})", f"held p99 ({p['version']})")),
    )
    out.print(make_table("nodes: p99 latency and time held, by policy", node_columns, node_rows))

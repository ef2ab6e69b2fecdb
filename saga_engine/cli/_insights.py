"""``saga insights NAME``: a saga type's insights, through its engine's admin API (``GET
/saga-types/{name}/insights``): throughput, outcomes, durations, the SLA, and per node of
the observed graph its share of runs, latency percentiles, retries, refusals, timeouts,
compensations and most frequent error."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer

from saga_engine.cli._common import AdminUrl, JsonOpt, admin_call, make_table, out, print_json

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
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """A saga type's observed graph and figures over a window."""
    body: dict[str, Any] = admin_call(
        admin_url,
        lambda api: api.get(
            f"/saga-types/{quote(name, safe='')}/insights", params=[("window", window)]
        ),
    )
    if as_json:
        print_json(body)
        return
    d = body["duration_ms"]
    outcomes = ", ".join(f"{k} {v}" for k, v in body["outcomes"].items()) or "none"
    out.print(
        f"{body['saga_type']}: {body['runs']} runs ended in the last {body['window']} "
        f"({body['throughput_per_minute']}/min); {outcomes}; "
        f"duration p50 {_ms(d['p50'])} p95 {_ms(d['p95'])} p99 {_ms(d['p99'])}"
    )
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

"""``saga flow``: flow control on an engine, through its admin API (``GET /flow``):
each limit with its configured figures, this engine's share, in flight and waiting, the
budget its commands in flight hold, and the fairness keys' weights; with several flow
policies, the policy of each limit (``saga flow-policy``: the policies and their
rollouts)."""

from __future__ import annotations

from typing import Any

import typer

from saga_engine.cli._common import AdminUrl, JsonOpt, admin_call, make_table, out, print_json

__all__ = ["commands"]

#: Added to the ``saga`` app without a name: ``saga flow``.
commands = typer.Typer()


@commands.command("flow")
def flow(admin_url: AdminUrl = None, as_json: JsonOpt = False) -> None:
    """Flow control: per participant and saga type limit, in flight, waiting and budget
    in use; the fairness keys' weights."""
    body: dict[str, Any] = admin_call(admin_url, lambda api: api.get("/flow"))
    if as_json:
        print_json(body)
        return
    if not body["enabled"]:
        out.print("flow control is off: no limit is configured (SAGA_LIMITS__...)")
        return
    budgets = any(gate.get("budget") for gate in body["gates"])
    # Several flow policies: which one each limit is of, and its share where it shares.
    policies = len(body.get("policies") or [1]) > 1
    rows = [
        (
            *((_policy(gate),) if policies else ()),
            gate["kind"],
            gate["name"],
            _concurrency(gate),
            _limit(gate["effective_rate"], gate["rate_limit"]),
            f"{gate['share']:.2f}",
            str(gate["in_flight"]),
            str(gate["waiting"]),
            *((_budget(gate),) if budgets else ()),
        )
        for gate in body["gates"]
    ]
    title = f"flow control (aging: {body['aging_s'] or 'off'} s per level"
    weights = body.get("fairness_weights") or {}
    if weights:
        title += "; fairness weights: " + ", ".join(f"{k}={w:g}" for k, w in weights.items())
    columns: tuple[str, ...] = ("policy",) if policies else ()
    columns += ("kind", "name", "concurrency", "rate/s", "share", "in flight")
    columns += ("waiting", "budget in use") if budgets else ("waiting",)
    out.print(make_table(title + ")", columns, rows, "ellipsis"))


def _policy(gate: dict[str, Any]) -> str:
    """A limit's flow policy, with its share of the limit where another policy limits
    the same name: ``2 (25%)``."""
    share = gate.get("policy_share", 1.0)
    return str(gate["policy"]) + (f" ({share:.0%})" if share < 1 else "")


def _budget(gate: dict[str, Any]) -> str:
    """Per resource, what the commands in flight hold of this engine's share of the
    budget, and the cluster-wide figure: ``cpu 12/16 of 32``."""
    budget = gate.get("budget")
    if not budget:
        return "-"
    mine = gate.get("effective_budget") or {}
    used = gate.get("budget_in_use") or {}
    return ", ".join(
        f"{r} {used.get(r, 0):g}/{mine.get(r, 0):g} of {amount:g}" for r, amount in budget.items()
    )


def _concurrency(gate: dict[str, Any]) -> str:
    """A fixed limit as ``_limit``; an adaptive one as its value now and why it moved."""
    adaptive = gate.get("adaptive")
    if adaptive is None:
        return _limit(gate["effective_concurrency"], gate["concurrency_limit"])
    return (
        f"adaptive {adaptive['limit']} ({adaptive['min']}-{adaptive['max']}): {adaptive['reason']}"
    )


def _limit(mine: float | None, configured: float | None) -> str:
    """This engine's share of a limit, and the cluster-wide figure: ``2 of 4``."""
    if configured is None:
        return "-"
    shown = f"{mine:g}" if mine is not None else "-"
    return f"{shown} of {configured:g}"

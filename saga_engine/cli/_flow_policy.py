"""``saga flow-policy show|rollout|clear``: the flow policies configured on an engine
(``LimitsSettings.policies``) and the rollout that gives one a share of new sagas,
through its admin API (``GET``/``PUT``/``DELETE /flow/policies...``), so a change is
audited with the token's name and the given reason like every operator action. Exit
codes as the other operator commands (docs/operations.md): 3 unknown saga type, 5
invalid (a percent above 100, an unknown predicate), 6 auth, 7 unreachable."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from saga_engine.cli._common import (
    AdminUrl,
    JsonOpt,
    admin_call,
    make_table,
    out,
    print_json,
)

__all__ = ["flow_policy_app"]

flow_policy_app = typer.Typer(
    no_args_is_help=True,
    help="Try a flow policy on a share of new sagas: show the policies and their "
    "rollouts, roll one out, or clear a rollout.",
)

_PATH = "/flow/policies"
_ROLLOUT = "/flow/policies/rollout"

SagaTypeOpt = Annotated[
    str | None,
    typer.Option("--saga-type", help="One saga type's rollout (default: the one of every type)."),
]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why; kept in the audit trail.")]


def _spec(spec: dict[str, Any] | None) -> str:
    if spec is None:
        return "none"
    text = f"policy {spec['version']} at {spec['percent']}%"
    return text + (f" + predicate {spec['predicate']!r}" if spec.get("predicate") else "")


def _limits(policy: dict[str, Any]) -> str:
    """A policy's limits in one cell: ``participant payments: concurrency 20, rate 50``."""
    parts = []
    for kind, table in (("participant", "participants"), ("saga type", "saga_types")):
        for name, limit in (policy.get(table) or {}).items():
            figures = ", ".join(
                f"{k} {v}" for k, v in limit.items() if v is not None and k != "budget"
            )
            if limit.get("budget"):
                budget = " ".join(f"{r}={a:g}" for r, a in limit["budget"].items())
                figures += (", " if figures else "") + f"budget {budget}"
            parts.append(f"{kind} {name}: {figures}")
    return "; ".join(parts) or "no limit"


def _print_view(view: dict[str, Any]) -> None:
    policies = view.get("policies") or {}
    rows = [
        (
            str(version),
            _limits(policy),
            ", ".join(f"{k}={w:g}" for k, w in (policy.get("fairness_weights") or {}).items())
            or "-",
            "yes" if policy.get("learned_costs", True) else "no",
        )
        for version, policy in policies.items()
    ]
    out.print(
        make_table("flow policies", ("policy", "limits", "fairness weights", "learned costs"), rows)
    )
    rollouts = [
        (r["saga_type"] or "every type", _spec(r["rollout"]), r["summary"], r["updated_by"])
        for r in view.get("rollouts") or []
    ]
    if rollouts:
        columns = ("saga type", "rollout", "new sagas", "set by")
        out.print(make_table("flow-policy rollouts", columns, rollouts))
    else:
        out.print("no flow-policy rollout: every new saga runs under policy 1")
    audit = view.get("audit") or []
    if audit:
        changes = [
            (
                c["at"],
                c["principal"],
                c["saga_type"],
                f"{_spec(c.get('before'))} -> {_spec(c.get('after'))}",
                c["reason"],
            )
            for c in audit
        ]
        header = ("at", "principal", "rollout", "change", "reason")
        out.print(make_table("audit (newest first)", header, changes))


@flow_policy_app.command("show")
def flow_policy_show(
    limit: Annotated[int, typer.Option("--limit", min=1, max=500, help="Audit rows.")] = 20,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the flow policies configured, their rollouts and the audit trail."""
    view = admin_call(admin_url, lambda api: api.get(_PATH, [("limit", str(limit))]))
    if as_json:
        print_json(view)
        return
    _print_view(view)


@flow_policy_app.command("rollout")
def flow_policy_rollout(
    version: Annotated[int, typer.Option("--version", help="The flow policy rolled out.")],
    percent: Annotated[
        int, typer.Option("--percent", help="Share of new sagas (0-100) that run under it.")
    ],
    reason: ReasonOpt,
    saga_type: SagaTypeOpt = None,
    predicate: Annotated[
        str | None,
        typer.Option("--predicate", help="A named predicate: matching starts run under it too."),
    ] = None,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Set which flow policy new sagas (of every type, or of one) run under (running
    sagas keep theirs): e.g. --version 2 --percent 10, then 50, 100; 0 rolls back."""
    body: dict[str, Any] = {"version": version, "percent": percent, "reason": reason}
    if saga_type is not None:
        body["saga_type"] = saga_type
    if predicate is not None:
        body["predicate"] = predicate
    view = admin_call(admin_url, lambda api: api.put(_ROLLOUT, body))
    if as_json:
        print_json(view)
        return
    mine = [r for r in view.get("rollouts") or [] if r["saga_type"] == saga_type]
    summary = mine[0]["summary"] if mine else "set"
    out.print(f"flow-policy rollout of {_whom(saga_type)} set: {summary}", highlight=False)


@flow_policy_app.command("clear")
def flow_policy_clear(
    reason: ReasonOpt,
    saga_type: SagaTypeOpt = None,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove a flow-policy rollout: new sagas of the type go back to the rollout of
    every type; without a type, to policy 1. Running sagas keep theirs."""
    params = [("reason", reason)]
    if saga_type is not None:
        params.append(("saga_type", saga_type))
    view = admin_call(admin_url, lambda api: api.call("DELETE", _ROLLOUT, params=params))
    if as_json:
        print_json(view)
        return
    out.print(f"flow-policy rollout of {_whom(saga_type)} cleared", highlight=False)


def _whom(saga_type: str | None) -> str:
    return saga_type if saga_type is not None else "every saga type"

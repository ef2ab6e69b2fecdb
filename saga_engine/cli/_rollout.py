"""``saga rollout show|set``: which version of a saga type new starts run, through an
engine's admin API (``GET``/``PUT /rollouts``), so a change is audited with the token's
name and the given reason like every operator action. Exit codes as the other operator
commands (docs/operations.md): 3 unknown type, 5 invalid (a percent above 100, an
unknown predicate), 6 auth, 7 unreachable."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from saga_engine.cli._common import (
    AdminApi,
    AdminUrl,
    JsonOpt,
    admin_call,
    field_table,
    make_table,
    out,
    print_json,
)

__all__ = ["rollout_app"]

rollout_app = typer.Typer(
    no_args_is_help=True,
    help="Roll a new saga version out gradually: show or set which version new starts run.",
)


def _path(saga_type: str) -> str:
    return AdminApi.path("rollouts", saga_type)


def _spec(spec: dict[str, Any] | None) -> str:
    if spec is None:
        return "none (highest deployed)"
    text = f"v{spec['version']} at {spec['percent']}%"
    return text + (f" + predicate {spec['predicate']!r}" if spec.get("predicate") else "")


def _print_view(view: dict[str, Any]) -> None:
    fields = [
        ("deployed versions", ", ".join(str(v) for v in view["versions"]) or "none"),
        ("rollout", _spec(view.get("rollout"))),
        ("set by", view.get("updated_by") or ""),
        ("new starts", view["summary"]),
    ]
    out.print(field_table(f"rollout of {view['saga_type']}", fields))
    audit = view.get("audit") or []
    if audit:
        rows = [
            (
                c["at"],
                c["principal"],
                f"{_spec(c.get('before'))} -> {_spec(c.get('after'))}",
                c["reason"],
            )
            for c in audit
        ]
        out.print(make_table("audit (newest first)", ("at", "principal", "change", "reason"), rows))


@rollout_app.command("show")
def rollout_show(
    saga_type: Annotated[
        str | None, typer.Argument(help="A saga type (default: every type).", show_default=False)
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500, help="Audit rows.")] = 20,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a saga type's rollout (or every type's) and its audit trail."""
    if saga_type is None:
        views = admin_call(admin_url, lambda api: api.get("/rollouts"))
    else:
        views = [
            admin_call(admin_url, lambda api: api.get(_path(saga_type), [("limit", str(limit))]))
        ]
    if as_json:
        print_json(views if saga_type is None else views[0])
        return
    for view in views:
        _print_view(view)


@rollout_app.command("set")
def rollout_set(
    saga_type: Annotated[str, typer.Argument(help="The saga type.")],
    version: Annotated[int, typer.Option("--version", help="The version rolled out.")],
    percent: Annotated[
        int, typer.Option("--percent", help="Share of new starts (0-100) that run it.")
    ],
    reason: Annotated[str, typer.Option("--reason", help="Why; kept in the audit trail.")],
    predicate: Annotated[
        str | None,
        typer.Option("--predicate", help="A named predicate: matching starts run it too."),
    ] = None,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """Set which version new starts of a saga type run (running sagas keep theirs):
    e.g. --version 2 --percent 0 (dark), then 10, 50, 100; back to 0 rolls back."""
    body: dict[str, Any] = {"version": version, "percent": percent, "reason": reason}
    if predicate is not None:
        body["predicate"] = predicate
    view = admin_call(admin_url, lambda api: api.put(_path(saga_type), body))
    if as_json:
        print_json(view)
        return
    out.print(f"rollout of {saga_type} set: {view['summary']} ({_when_now(view)})", highlight=False)


def _when_now(view: dict[str, Any]) -> str:
    audit = view.get("audit") or []
    return f"audited at {audit[0]['at']}" if audit else "audited"

"""``saga graph NAME``: a graph saga's declared graph, as a table (each node's kind,
participant, the nodes it runs after, its condition or fan-out bound, whether it is
compensable) or, with ``--dot``, as Graphviz dot (``saga graph fulfil --dot | dot -Tsvg``).

Read from an engine's admin API (``GET /saga-types/{name}``), or, with ``--sagas
MODULE``, from the saga classes themselves, as ``saga replay`` loads them: no engine
needed (in CI, say)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import quote

import typer

from saga_engine.cli._common import (
    EXIT_CODES,
    AdminUrl,
    JsonOpt,
    admin_call,
    err,
    fail,
    make_table,
    out,
    print_json,
    run_sync,
)
from saga_engine.core.authoring._definition import SagaRegistry
from saga_engine.core.planning._replay import load_sagas
from saga_engine.kernel._errors import UnknownSagaType
from saga_engine.kernel._serde import JsonDict

__all__ = ["commands", "dot", "table_rows"]

#: Added to the ``saga`` app without a name: ``saga graph``.
commands = typer.Typer()

COLUMNS = ("node", "kind", "participant", "after", "condition / bound", "compensable", "cost")


@commands.command("graph")
def graph(
    name: Annotated[str, typer.Argument(help="The saga type.")],
    as_dot: Annotated[bool, typer.Option("--dot", help="Print Graphviz dot.")] = False,
    sagas: Annotated[
        str | None,
        typer.Option(
            "--sagas",
            "-s",
            help="Read the graph from the saga classes of this module (pkg.mod or "
            "pkg.mod:attr) instead of an engine's admin API.",
        ),
    ] = None,
    admin_url: AdminUrl = None,
    as_json: JsonOpt = False,
) -> None:
    """A graph saga's declared graph: its nodes and what each runs after."""
    declared = _local(name, sagas) if sagas else _remote(name, admin_url)
    if declared is None:
        fail(
            f"saga type {name!r} is written as code: it declares no graph (a "
            "saga_engine.graph.GraphSaga does)"
        )
    if as_json:
        print_json(declared)
    elif as_dot:
        typer.echo(dot(name, declared))
    else:
        out.print(
            make_table(f"{name}: the declared graph, in its order", COLUMNS, table_rows(declared))
        )


def _remote(name: str, option: str | None) -> JsonDict | None:
    body: dict[str, Any] = admin_call(
        option, lambda api: api.get(f"/saga-types/{quote(name, safe='')}")
    )
    found: JsonDict | None = body.get("graph")
    return found


def _local(name: str, spec: str) -> JsonDict | None:
    registry = run_sync(lambda: SagaRegistry(load_sagas(spec)))
    try:
        declared = registry.get(name).graph
    except UnknownSagaType as exc:
        err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
        raise typer.Exit(EXIT_CODES[404]) from None
    return None if declared is None else declared.as_dict()


def _condition(node: JsonDict) -> str:
    """``when`` for a conditional node, ``≤ N items`` for a fan-out."""
    parts = ["when"] if node["conditional"] else []
    if node["kind"] == "each":
        parts.append(f"≤ {node['max_items']} items")
    return ", ".join(parts) or "-"


def _cost(cost: object) -> str:
    """A declared cost: ``cpu=4, memory_mb=512``, a class's name, or ``-``."""
    if isinstance(cost, dict):
        return ", ".join(f"{k}={v:g}" for k, v in cost.items())
    return str(cost) if cost else "-"


def table_rows(declared: JsonDict) -> list[tuple[str, ...]]:
    """One row per node, in the graph's order (``COLUMNS``)."""
    return [
        (
            n["name"],
            f"{n['kind']} (pivot)" if n.get("pivot") else n["kind"],
            n["to"],
            ", ".join(n["after"]) or "-",
            _condition(n),
            "yes" if n["compensable"] else "no",
            _cost(n.get("cost")),
        )
        for n in declared["nodes"]
    ]


def _escaped(text: str) -> str:
    """Text inside a dot string: ``"`` and ``\\`` escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _quoted(*lines: str) -> str:
    """A dot string of ``lines`` (joined by dot's line break, ``\\n``)."""
    return '"' + "\\n".join(_escaped(line) for line in lines) + '"'


def dot(name: str, declared: JsonDict) -> str:
    """The graph as Graphviz dot: left to right, an edge from each node to the nodes
    that run after it; a conditional node dashed, a fan-out stacked, a node that owes no
    compensation grey."""
    lines = [f"digraph {_quoted(name)} {{", "  rankdir=LR;", "  node [shape=box];"]
    for n in declared["nodes"]:
        does = f"{n['kind']} → {n['to']}"
        if n["kind"] == "each":
            does += f" (≤ {n['max_items']})"
        attrs = [f"label={_quoted(n['name'], does)}"]
        if n["kind"] == "each":
            attrs.append("shape=box3d")
        if n["conditional"]:
            attrs.append("style=dashed")
        if not n["compensable"]:
            attrs.append("color=grey40")
        lines.append(f"  {_quoted(n['name'])} [{', '.join(attrs)}];")
    for dep, dependent in declared["edges"]:
        lines.append(f"  {_quoted(dep)} -> {_quoted(dependent)};")
    lines.append("}")
    return "\n".join(lines)

"""Graphs as SVG, drawn on the server (no script, no external asset: the page's CSP is
unchanged): the observed graph of a saga type (the insights page) and a graph saga's
declared graph (the saga page, with each node's state; the insights page, with each
node's latency). One drawing: boxes in columns, left to right, joined by edges.

The observed graph: nodes in the order they start; a node that overlapped one of the
column's nodes in some run (a ``gather`` branch) joins that column, otherwise it opens
the next one, and each column leads to the next. A box says the node's share of runs and
its p95 latency; a node with refusals, timeouts or compensations is outlined as a hot
spot.

A declared graph: a node's column is one past the deepest of the nodes it runs after
(the nodes it depends on are to its left), each edge drawn from the node depended on to
its dependent. A box says what the node does (its kind and participant, a fan-out's
bound, a condition) and, on a saga's page, its state (coloured), its items' states and
its latency; on the insights page, its p95 latency.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from itertools import pairwise
from typing import Any, Final

from saga_engine.kernel._serde import JsonDict

_W: Final = 190
_H: Final = 58
_GAP_X: Final = 50
_GAP_Y: Final = 16
_PAD: Final = 10
#: What a missing figure reads as.
NONE: Final = "n/a"
_INK: Final = "#5b6b82"
_HOT: Final = "#c0392b"
#: A declared node's colours by state: (fill, outline).
STATE_COLOURS: Final[dict[str, tuple[str, str]]] = {
    "pending": ("#f4f6fa", "#9aa3ad"),
    "running": ("#e3f0fa", "#4a90c2"),
    "done": ("#e5f4ea", "#2e9d4f"),
    "skipped": ("#f4f6fa", "#c5ccd3"),
    "failed": ("#fbe6e6", "#d64545"),
    "stopped": ("#fdf3df", "#e0a020"),
    "stuck": ("#fbe6e6", "#d64545"),
    "undoing": ("#efe8fa", "#7b4fc9"),
    "undone": ("#efe8fa", "#7b4fc9"),
}


@dataclass(frozen=True, slots=True)
class Box:
    """One node as drawn: its name, a tooltip, two lines under the name, its look."""

    name: str
    title: str
    lines: tuple[str, str]
    css: str = "node"
    fill: str = "#f4f6fa"
    stroke: str = _INK
    stroke_width: int = 1


def fmt_ms(value: float | None) -> str:
    """A latency for people: `250 ms`, `1.5 s`, `n/a` without one."""
    if value is None:
        return NONE
    return f"{value / 1000:g} s" if value >= 1000 else f"{value:g} ms"


def _short(name: str) -> str:
    return name if len(name) <= 24 else name[:23] + "…"


def _box(box: Box, x: int, y: int) -> list[str]:
    first, second = box.lines
    return [
        f'<g class="{escape(box.css)}" data-node="{escape(box.name)}">',
        f"<title>{escape(box.title)}</title>",
        f'<rect x="{x}" y="{y}" width="{_W}" height="{_H}" rx="6" fill="{box.fill}" '
        f'stroke="{box.stroke}" stroke-width="{box.stroke_width}"/>',
        f'<text x="{x + 8}" y="{y + 18}" font-size="13" font-weight="bold">'
        f"{escape(_short(box.name))}</text>",
        f'<text x="{x + 8}" y="{y + 35}" font-size="11">{escape(first)}</text>',
        f'<text x="{x + 8}" y="{y + 50}" font-size="11">{escape(second)}</text>',
        "</g>",
    ]


def draw(
    svg_id: str, label: str, cols: Sequence[Sequence[Box]], edges: Sequence[tuple[str, str]]
) -> str:
    """Boxes in columns (left to right, each column centred), an edge drawn from each
    pair's first box to its second: an inline SVG element (empty without a box)."""
    if not cols:
        return ""
    tallest = max(len(c) for c in cols)
    width = _PAD * 2 + len(cols) * _W + (len(cols) - 1) * _GAP_X
    height = _PAD * 2 + tallest * _H + (tallest - 1) * _GAP_Y
    out: list[Any] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{svg_id}" class="graph" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{escape(label)}" font-family="sans-serif">'
    ]
    places: dict[str, tuple[int, int]] = {}
    for i, col in enumerate(cols):
        x = _PAD + i * (_W + _GAP_X)
        top = _PAD + (tallest - len(col)) * (_H + _GAP_Y) // 2
        for j, box in enumerate(col):
            places[box.name] = (x, top + j * (_H + _GAP_Y))
    for a, b in edges:
        (x1, y1), (x2, y2) = places[a], places[b]
        out.append(
            f'<line class="edge" x1="{x1 + _W}" y1="{y1 + _H // 2}" x2="{x2}" '
            f'y2="{y2 + _H // 2}" stroke="#8795a8" stroke-width="1.5"/>'
        )
    for col in cols:
        for box in col:
            out.extend(_box(box, *places[box.name]))
    out.append("</svg>")
    return "".join(out)


# --------------------------------------------------------------------------- observed


def columns(report: JsonDict) -> list[list[JsonDict]]:
    """The report's nodes laid out in columns (parallel branches share one)."""
    parallel = {frozenset(p["nodes"]) for p in report["parallel"]}
    cols: list[list[JsonDict]] = []
    for node in report["nodes"]:
        last = cols[-1] if cols else []
        if any(frozenset((node["name"], other["name"])) in parallel for other in last):
            last.append(node)
        else:
            cols.append([node])
    return cols


def _observed(node: JsonDict) -> Box:
    hot = any(node[k] for k in ("refusal_rate", "timeout_rate", "compensation_rate"))
    share = node["share"]
    return Box(
        node["name"],
        f"{node['name']} ({node['kind']}): {node['runs']} runs",
        (
            f"{node['kind']} · {NONE if share is None else f'{share:.0%}'} of runs",
            f"p95 {fmt_ms(node['latency_ms']['p95'])} · "
            f"{node['attempts_per_success'] or NONE} tries/ok",
        ),
        css="node hot" if hot else "node",
        stroke=_HOT if hot else _INK,
        stroke_width=2 if hot else 1,
    )


def graph_svg(report: JsonDict) -> str:
    """The observed graph of ``report`` (``build_report``'s document) as an inline SVG."""
    cols = [[_observed(n) for n in col] for col in columns(report)]
    edges = [(a.name, b.name) for here, there in pairwise(cols) for a in here for b in there]
    return draw("insight-graph", f"the observed graph of {report['saga_type']}", cols, edges)


# --------------------------------------------------------------------------- declared


def _layers(nodes: Sequence[JsonDict]) -> list[list[JsonDict]]:
    """A declared graph's nodes (in its topological order) by depth: each one column
    past the deepest node it runs after."""
    depth: dict[str, int] = {}
    cols: list[list[JsonDict]] = []
    for node in nodes:
        d = 1 + max((depth[a] for a in node["after"]), default=-1)
        depth[node["name"]] = d
        if d == len(cols):
            cols.append([])
        cols[d].append(node)
    return cols


def _does(node: JsonDict) -> str:
    """What a declared node does, in a few words: ``each → warehouse (≤ 5) · if``."""
    kind = node["kind"]
    bound = f" (≤ {node['max_items']})" if kind == "each" else ""
    condition = " · if" if node["conditional"] else ""
    return f"{kind} → {node['to']}{bound}{condition}"


def _with_state(node: JsonDict) -> Box:
    state = node["state"]
    fill, stroke = STATE_COLOURS.get(state, STATE_COLOURS["pending"])
    items = ", ".join(f"{n} {s}" for s, n in sorted(node["items"].items()))
    second = f"{state} ({items})" if items else state
    if node["latency_ms"] is not None:
        second += f" · {fmt_ms(round(node['latency_ms']))}"
    return Box(
        node["name"],
        f"{node['name']}: {_does(node)}; {second}",
        (_does(node), second),
        css=f"node st-{state}",
        fill=fill,
        stroke=stroke,
        stroke_width=2 if state in ("failed", "stuck", "running") else 1,
    )


def _with_latency(node: JsonDict) -> Box:
    p95 = node["latency_ms"]["p95"]
    return Box(
        node["name"],
        f"{node['name']}: {_does(node)}; {node['attempts']} commands in the window",
        (_does(node), f"p95 {fmt_ms(p95)} · {node['attempts']} sent"),
    )


def declared_svg(graph: JsonDict, svg_id: str, label: str) -> str:
    """A declared graph as an inline SVG: ``GraphState.as_dict()``'s (each node's
    state), ``graph_insight``'s (each node's latency) or ``Graph.as_dict()``'s."""
    nodes: list[JsonDict] = graph["nodes"]
    look: Callable[[JsonDict], Box] = _declared
    if nodes and "state" in nodes[0]:
        look = _with_state
    elif nodes and "latency_ms" in nodes[0]:
        look = _with_latency
    cols = [[look(n) for n in col] for col in _layers(nodes)]
    edges = [(a, b) for a, b in graph["edges"]]
    return draw(svg_id, label, cols, edges)


def _declared(node: JsonDict) -> Box:
    after = ", ".join(node["after"]) or "nothing"
    return Box(node["name"], f"{node['name']}: {_does(node)}", (_does(node), f"after {after}"))

"""The observed graph of a saga type as an SVG, drawn on the server (no script, no
external asset: the page's CSP is unchanged).

Nodes in the order they start; a node that overlapped one of the column's nodes in some
run (a ``gather`` branch) joins that column, otherwise it opens the next one. Each
column leads to the next. A box says the node's share of runs and its p95 latency; a
node with refusals, timeouts or compensations is outlined as a hot spot.
"""

from __future__ import annotations

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


def fmt_ms(value: int | None) -> str:
    """A latency for people: `250 ms`, `1.5 s`, `n/a` without one."""
    if value is None:
        return NONE
    return f"{value / 1000:g} s" if value >= 1000 else f"{value} ms"


def _box(node: JsonDict, x: int, y: int) -> list[str]:
    hot = any(node[k] for k in ("refusal_rate", "timeout_rate", "compensation_rate"))
    share = node["share"]
    label = escape(node["name"] if len(node["name"]) <= 24 else node["name"][:23] + "…")
    return [
        f'<g class="node{" hot" if hot else ""}" data-node="{escape(node["name"])}">',
        f"<title>{escape(node['name'])} ({node['kind']}): {node['runs']} runs</title>",
        f'<rect x="{x}" y="{y}" width="{_W}" height="{_H}" rx="6" fill="#f4f6fa" '
        f'stroke="{"#c0392b" if hot else "#5b6b82"}" stroke-width="{2 if hot else 1}"/>',
        f'<text x="{x + 8}" y="{y + 18}" font-size="13" font-weight="bold">{label}</text>',
        f'<text x="{x + 8}" y="{y + 35}" font-size="11">{node["kind"]} · '
        f"{NONE if share is None else f'{share:.0%}'} of runs</text>",
        f'<text x="{x + 8}" y="{y + 50}" font-size="11">p95 {fmt_ms(node["latency_ms"]["p95"])}'
        f" · {node['attempts_per_success'] or NONE} tries/ok</text>",
        "</g>",
    ]


def graph_svg(report: JsonDict) -> str:
    """The graph of ``report`` (``build_report``'s document) as an inline SVG element."""
    cols = columns(report)
    if not cols:
        return ""
    tallest = max(len(c) for c in cols)
    width = _PAD * 2 + len(cols) * _W + (len(cols) - 1) * _GAP_X
    height = _PAD * 2 + tallest * _H + (tallest - 1) * _GAP_Y
    out: list[Any] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="insight-graph" class="graph" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="the observed graph of {escape(report["saga_type"])}" '
        'font-family="sans-serif">'
    ]
    places: list[list[tuple[int, int]]] = []
    for i, col in enumerate(cols):
        x = _PAD + i * (_W + _GAP_X)
        top = _PAD + (tallest - len(col)) * (_H + _GAP_Y) // 2
        places.append([(x, top + j * (_H + _GAP_Y)) for j in range(len(col))])
    for here, there in pairwise(places):
        for x1, y1 in here:
            for x2, y2 in there:
                out.append(
                    f'<line class="edge" x1="{x1 + _W}" y1="{y1 + _H // 2}" x2="{x2}" '
                    f'y2="{y2 + _H // 2}" stroke="#8795a8" stroke-width="1.5"/>'
                )
    for col, spots in zip(cols, places, strict=True):
        for node, (x, y) in zip(col, spots, strict=True):
            out.extend(_box(node, x, y))
    out.append("</svg>")
    return "".join(out)

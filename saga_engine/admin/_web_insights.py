"""The insights page of a saga type: ``GET /ui/saga-types/{name}/insights?window=&flow_policy=``,
what the API's ``GET /saga-types/{name}/insights`` answers, with the observed graph as
an SVG drawn here (``_graph_svg``; a graph saga's declared graph beside it, each node's
latency), the per-node table and the SLA's breaching runs,
each a link to its saga; when runs of more than one flow policy ended in the window, a
"by flow policy" table (``GET /saga-types/{name}/insights/policies``), each policy a link
to its own figures. Read only: a reader's session shows it.

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

from typing import Annotated, Literal
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, Response

from saga_engine.admin._auth import relative_redirect
from saga_engine.admin._deps import _state, page_user
from saga_engine.admin._graph_svg import NONE, declared_svg, fmt_ms, graph_svg
from saga_engine.admin._insights import FlowPolicyQuery, insights_report, policy_comparison
from saga_engine.admin._web import _render, _root
from saga_engine.core.views._insight_report import nodes_by_policy
from saga_engine.core.views._insights import CPU, PHASES, WINDOWS
from saga_engine.kernel._input_types import StorableText

__all__ = ["insights_page_router"]


def _pct(value: float | None) -> str:
    return NONE if value is None else f"{value:.1%}"


def _mean(value: float | None) -> str:
    """A mean time for people: `0.412 ms`, `1.5 s`, `n/a` without one."""
    if value is None:
        return NONE
    return f"{value / 1000:.3g} s" if value >= 1000 else f"{value:.3g} ms"


#: The columns of the page's "where the time goes" table, by phase.
_PHASE_NAMES = {
    "held": "Held",
    "to_participant": "To participant",
    "waiting": "Waiting",
    "handler": "Handler",
    "commit": "Commit",
    "back": "Back",
    "apply": "Apply",
    CPU: "CPU",
}


def insights_page_router() -> APIRouter:
    router = APIRouter(prefix="/ui", include_in_schema=False)

    @router.get("/insights", name="ui_insights_index")
    async def insights_index(request: Request) -> Response:
        """The header's link: the first saga type's insights (the page links the others)."""
        names = sorted(_state(request).parts.registry.names())
        if not names:
            raise HTTPException(404, "no saga type is registered")
        return relative_redirect(
            request.scope, f"/ui/saga-types/{quote(names[0], safe='')}/insights"
        )

    @router.get("/saga-types/{name}/insights", name="ui_insights")
    async def insights_view(
        request: Request,
        name: Annotated[Annotated[str, StorableText(max_length=200)], Path()],
        window: Annotated[Literal["1h", "1d", "7d"], Query()] = "1h",
        flow_policy: FlowPolicyQuery = None,
    ) -> HTMLResponse:
        parts = _state(request).parts
        report = await insights_report(parts, name, window, flow_policy)
        by_policy = (
            await policy_comparison(parts, name, window)
            if len(report["flow_policies"]) > 1
            else None
        )
        return _render(
            "insights.html",
            root=_root(request),
            user=page_user(request),
            r=report,
            by_policy=by_policy,
            policy_nodes=nodes_by_policy(by_policy) if by_policy else [],
            svg=graph_svg(report),
            declared=declared_svg(
                report["graph"], "declared-graph", f"the declared graph of {name}"
            )
            if report["graph"]
            else "",
            types=sorted(parts.registry.names()),
            windows=list(WINDOWS),
            quote=quote,
            ms=fmt_ms,
            pct=_pct,
            mean=_mean,
            na=NONE,
            phases=(*PHASES, CPU),
            phase_names=_PHASE_NAMES,
        )

    return router

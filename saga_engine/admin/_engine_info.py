"""The admin API about the engine itself: liveness, the saga types it runs, metrics.

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

from typing import Annotated

from fastapi import APIRouter, Header, Path
from fastapi.responses import PlainTextResponse, Response

from saga_engine.admin import _metrics as metrics_mod
from saga_engine.admin._deps import HealthDep, PartsDep
from saga_engine.admin._insights import prometheus_lines
from saga_engine.admin._route_helpers import READ_ERRORS, errors
from saga_engine.admin._schemas import (
    GraphInfo,
    Health,
    MetricsBody,
    SagaTypeDetail,
    SagaTypeInfo,
)
from saga_engine.core.views._graph_view import declared_graph
from saga_engine.kernel._input_types import StorableText

__all__ = ["public_router", "router"]

#: Routes that need no token (the app includes it without the bearer scheme).
public_router = APIRouter()
router = APIRouter()


@public_router.get(
    "/health",
    response_model=Health,
    response_model_exclude_none=True,
    tags=["meta"],
    responses={503: {"model": Health, "description": "failing: only a restart cures it"}},
)
async def health(board: HealthDep, response: Response) -> Health:
    """Liveness: the process and its event loop answer. Needs no token. ``degraded``
    (still 200: restarting would not cure it) lists what is wrong, e.g. a partition no
    fetch can read, or a consumer group that does not settle. ``failing`` (503) says what
    only a restart cures: the inbox consumer stopped."""
    if board is None or board.status == "ok":
        return Health()
    if board.status == "failing":
        response.status_code = 503
        return Health(status="failing", problems=board.problems)
    return Health(status="degraded", problems=board.problems)


@router.get("/saga-types", response_model=list[SagaTypeInfo], responses=errors(401))
async def saga_types(parts: PartsDep) -> list[SagaTypeInfo]:
    """The saga types this engine can start, with their input and output schemas."""
    return [
        SagaTypeInfo(
            name=d.name,
            input_schema=d.input_type.model_json_schema(),
            output_schema=d.output_type.model_json_schema(),
        )
        for d in sorted(parts.registry, key=lambda d: d.name)
    ]


@router.get(
    "/saga-types/{name}",
    response_model=SagaTypeDetail,
    responses=errors(404, 401, 422),
    tags=["saga types"],
)
async def saga_type(
    parts: PartsDep,
    name: Annotated[Annotated[str, StorableText(max_length=200)], Path()],
) -> SagaTypeDetail:
    """One saga type this engine can start (its highest version): its input and output
    schemas, its versions, signals and search attributes, and a graph saga's declared
    graph (its nodes and edges; null for a saga written as code). An unknown type is a
    404 naming the known ones."""
    definition = parts.registry.get(name)  # UnknownSagaType: 404
    graph = declared_graph(definition)
    return SagaTypeDetail(
        name=definition.name,
        input_schema=definition.input_type.model_json_schema(),
        output_schema=definition.output_type.model_json_schema(),
        version=definition.version,
        versions=sorted(parts.registry.versions(name)),
        signals=sorted(definition.signals),
        search_attributes=list(definition.search_attributes),
        graph=None if graph is None else GraphInfo.model_validate(graph.as_dict()),
    )


@router.get(
    "/metrics",
    response_model=MetricsBody,
    responses={
        200: {
            "content": {metrics_mod.PROMETHEUS_CONTENT_TYPE: {"schema": {"type": "string"}}},
            "description": "JSON, or the Prometheus text format for `Accept: text/plain`.",
        },
        **errors(*READ_ERRORS),
    },
)
async def metrics(
    parts: PartsDep,
    accept: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> MetricsBody | Response:
    """Open sagas by status, the oldest parked saga's age, dead letters, counters."""
    body = await metrics_mod.collect(parts)
    if metrics_mod.wants_text(accept):
        text = metrics_mod.render_prometheus(body) + "".join(
            f"{line}\n" for line in await prometheus_lines(parts)
        )
        return PlainTextResponse(text, media_type=metrics_mod.PROMETHEUS_CONTENT_TYPE)
    return body

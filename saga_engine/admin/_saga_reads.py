"""The admin API's saga reads: the filtered list, one saga, its history (export).

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from saga_engine.admin._deps import PartsDep, StepBoardDep
from saga_engine.admin._lineage import children, reruns, tree
from saga_engine.admin._listing import attribute_filters, saga_page
from saga_engine.admin._route_helpers import (
    READ_ERRORS,
    SagaIdPath,
    errors,
    load,
    load_run,
    saga_ref,
)
from saga_engine.admin._schemas import (
    HistoryDocument,
    LineageNode,
    SagaDetail,
    SagaGraph,
    SagaPage,
)
from saga_engine.admin._views import awaited, detail_of, graph_of, view_of, with_runs
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.planning._replay import export_history
from saga_engine.kernel._input_types import Instant, StorableText, check_time_range
from saga_engine.runner._parts import EngineParts
from saga_engine.store._store import SagaFilter

__all__ = ["router"]

router = APIRouter()

_FILENAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

RootsQuery = Annotated[bool, Query(description="Only sagas no other saga started: no children.")]
# Activity by default: an operator looks for what just moved or stuck, newest on top (as
# Temporal's and Camunda's lists do); id order stays for scripts walking every saga.
SortQuery = Annotated[
    Literal["activity", "id"],
    Query(
        description="activity: last activity (end, or last change of an open saga), newest "
        "first; id: saga id, ascending."
    ),
]


@router.get("/sagas", response_model=SagaPage, responses=errors(400, *READ_ERRORS))
async def list_sagas(
    request: Request,
    parts: PartsDep,
    status: Annotated[
        list[SagaStatus] | None, Query(description="Repeat to match any of several.")
    ] = None,
    saga_type: Annotated[
        Annotated[str, StorableText(min_length=1, max_length=100)] | None, Query(alias="type")
    ] = None,
    created_after: Annotated[
        Instant | None, Query(description="ISO-8601; without an offset, UTC. Inclusive.")
    ] = None,
    created_before: Annotated[Instant | None, Query(description="Exclusive.")] = None,
    updated_after: Annotated[Instant | None, Query(description="Inclusive.")] = None,
    updated_before: Annotated[Instant | None, Query(description="Exclusive.")] = None,
    q: Annotated[
        Annotated[str, StorableText(min_length=1, max_length=200)] | None,
        Query(description="A saga id, or its first characters; or an idempotency key."),
    ] = None,
    roots: RootsQuery = False,
    sort: SortQuery = "activity",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[
        Annotated[str, StorableText(max_length=2000)] | None,
        Query(description="next_cursor of the previous page (same sort)."),
    ] = None,
) -> SagaPage:
    """Sagas by last activity (newest first) or by id, filtered, each with what it waits
    for; page through them with ``cursor``. The first page also counts the sagas that
    match every filter but ``status``, per status.

    Any other query parameter names a search attribute a saga type declares
    (``Saga.search_attributes``) and must match exactly, e.g. ``?order_id=o-42``; one no
    deployed type declares is a 422."""
    _check_ranges(created_after, created_before, updated_after, updated_before)
    where = SagaFilter(
        statuses=frozenset(status) if status else None,
        saga_type=saga_type,
        created_after=created_after,
        created_before=created_before,
        updated_after=updated_after,
        updated_before=updated_before,
        search=q,
        attributes=dict(_attributes(request, parts)),
        roots_only=roots,
    )
    return await saga_page(
        parts.store, parts.registry, where, limit=limit, cursor=cursor, order=sort
    )


def _check_ranges(*bounds: datetime | None) -> None:
    """(created_after, created_before, updated_after, updated_before): each pair in order,
    a 422 naming the ``*_after`` parameter (as a batch operation's filter does)."""
    for low, high, what in ((bounds[0], bounds[1], "created"), (bounds[2], bounds[3], "updated")):
        problem = check_time_range(low, high, what)
        if problem is not None:
            loc = ("query", f"{what}_after")
            raise RequestValidationError([{"loc": loc, "msg": problem, "type": "time_range"}])


def _attributes(request: Request, parts: EngineParts) -> tuple[tuple[str, str], ...]:
    declared = {name for d in parts.registry for name in d.search_attributes}
    try:
        return attribute_filters(list(request.query_params.multi_items()), declared)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None


@router.get(
    "/sagas/{saga}",
    response_model=SagaDetail,
    name="get_saga",
    responses=errors(404, 409, *READ_ERRORS),
)
async def get_saga(
    saga: SagaIdPath,
    parts: PartsDep,
    board: StepBoardDep,
) -> SagaDetail:
    """Status, input, output or error, current step, what it waits for (``waiting_for``),
    the commands in flight (each with its participant's latest reports, ``progress``),
    pending compensations, next wake-up."""
    record, events = await load_run(parts.store, saga)  # its current run: flat
    view = view_of(record, events, awaited(parts.registry, record, events))
    # What no longer runs (its reply is in the history) shows no reports, nor keeps them.
    board.retain(record.saga_id, {f.command_id for f in view.in_flight})
    found = detail_of(
        record,
        view,
        events,
        await children(parts.store, record.saga_id, events),
        await reruns(parts.store, record.saga_id),
        board.reports(record.saga_id),
    )
    return await with_runs(parts.store, found, parts.settings.engine.continue_as_new_after)


@router.get(
    "/sagas/{saga_id}/lineage",
    response_model=LineageNode,
    name="get_lineage",
    responses=errors(404, 409, *READ_ERRORS),
)
async def lineage(
    saga_id: SagaIdPath,
    parts: PartsDep,
) -> LineageNode:
    """The tree of parent and child sagas this saga belongs to, from its root: each saga
    with its status and the children it started (at most 100 sagas)."""
    await load(parts.store, saga_id)  # 404 for an unknown saga, as the other reads
    return await tree(parts.store, saga_ref(saga_id))


@router.get(
    "/sagas/{saga_id}/graph",
    response_model=SagaGraph,
    name="get_saga_graph",
    responses=errors(404, 409, *READ_ERRORS),
)
async def saga_graph(saga_id: SagaIdPath, parts: PartsDep) -> SagaGraph:
    """A graph saga's declared graph (of the version it runs) with each node's state
    (pending, running, done, skipped, failed, stopped, stuck, undoing, undone; a
    fan-out's over its items, with counts) and latency, from its history. A saga written
    as code, or of a type not deployed here, is a 404 saying so."""
    record, events = await load(parts.store, saga_id)
    state = graph_of(parts.registry, record, view_of(record, events), events)
    if state is None:
        raise HTTPException(
            404,
            f"saga {record.saga_id!r} is a {record.saga_type!r}, which is written as code and "
            "declares no graph; its steps are in GET /sagas/{id}",
        )
    return SagaGraph(
        saga_id=record.saga_id,
        saga_type=record.saga_type,
        saga_version=record.saga_version,
        status=record.status,
        **state.as_dict(),
    )


@router.get(
    "/sagas/{saga_id}/history",
    response_model=HistoryDocument,
    responses=errors(404, 409, *READ_ERRORS),
)
async def history(
    saga_id: SagaIdPath,
    response: Response,
    parts: PartsDep,
    download: Annotated[
        bool, Query(description="Serve it as a file (Content-Disposition).")
    ] = False,
) -> dict[str, Any]:
    """The full event list, as the JSON that ``saga replay`` reads."""
    record, events = await load(parts.store, saga_id)
    if download:
        name = _FILENAME_UNSAFE.sub("_", record.saga_id)[:120]
        response.headers["Content-Disposition"] = f'attachment; filename="saga-{name}.history.json"'
    return export_history(record.saga_id, record.saga_type, events)

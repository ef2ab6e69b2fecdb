"""The admin API's durable schedules: create, list, get, pause, resume, delete, trigger.

A schedule's definition is checked when it is created: a bad cron expression, interval
or time zone, an unknown saga type, or an input the saga's input model refuses is a 422
naming the field. An unknown schedule id is a 404; creating an id that exists with
another definition a 409 (the same definition again is a 200, changing nothing).

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from saga_engine.admin._deps import AdminState, Caller, PartsDep, StarterDep, _state
from saga_engine.admin._http_errors import api_router, request_fields
from saga_engine.admin._route_helpers import READ_ERRORS, errors
from saga_engine.core.planning._schedule import Schedule, ScheduleState
from saga_engine.kernel._errors import UnknownSagaType
from saga_engine.kernel._input_types import StorableText
from saga_engine.store._schedule_store import Firing, ScheduleRow, ScheduleStore

__all__ = ["ScheduleOut", "TriggerResult", "router"]

audit = logging.getLogger("saga_engine.admin.audit")

router = api_router()

#: What an action on one schedule may answer besides its success (409: pause, resume).
_ACT = (401, 403, 404, 422, 503)

ScheduleId = Annotated[
    Annotated[str, StorableText(min_length=1, max_length=120)],
    Path(description="The schedule's id."),
]


class ScheduleOut(BaseModel):
    """A schedule, its state and its progress."""

    id: str
    saga: str
    spec: str = Field(description="The spec in words: `cron */5 * * * * (UTC)`, `every 60s`.")
    definition: Schedule
    state: ScheduleState
    origin: str = Field(description="`code` (declared in a worker) or `api`.")
    next_fire_at: datetime
    last_fired_at: datetime | None
    last_tick: datetime | None
    last_saga_id: str | None
    last_saga_url: str | None
    fired_count: int
    skipped_count: int
    created_at: datetime
    updated_at: datetime


class TriggerResult(BaseModel):
    schedule_id: str
    saga_id: str
    status_url: str


def _store(request: Request) -> ScheduleStore:
    state: AdminState = _state(request)
    if state.schedules is None:
        raise HTTPException(503, "schedules are served by a worker's admin API (SagaWorker)")
    return state.schedules


StoreDep = Annotated[ScheduleStore, Depends(_store)]


def _saga_url(request: Request, saga_id: str) -> str:
    return f"{request.scope.get('root_path', '')}/sagas/{quote(saga_id, safe='')}"


def out(request: Request, row: ScheduleRow) -> ScheduleOut:
    s = row.schedule
    return ScheduleOut(
        id=s.id,
        saga=s.saga,
        spec=s.spec.describe(),
        definition=s,
        state=row.state,
        origin=row.origin,
        next_fire_at=row.next_fire_at,
        last_fired_at=row.last_fired_at,
        last_tick=row.last_tick,
        last_saga_id=row.last_saga_id,
        last_saga_url=_saga_url(request, row.last_saga_id) if row.last_saga_id else None,
        fired_count=row.fired_count,
        skipped_count=row.skipped_count,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def _now() -> datetime:
    return datetime.now(UTC)


@router.post(
    "/schedules",
    status_code=201,
    response_model=ScheduleOut,
    responses={
        200: {"model": ScheduleOut, "description": "It exists with this definition already."},
        **errors(400, 401, 403, 409, 413, 422, 503),
    },
)
async def create_schedule(
    body: Schedule, request: Request, caller: Caller, parts: PartsDep, store: StoreDep
) -> Response:
    """Creates a schedule; it fires from its next tick after now."""
    try:
        definition = parts.registry.get(body.saga)
    except UnknownSagaType as exc:
        raise HTTPException(
            422, [{"loc": ["body", "saga"], "msg": str(exc), "type": "unknown_saga_type"}]
        ) from None
    with request_fields(("body", "input")):  # the fields are the input's
        definition.validate_input(body.input)
    outcome = await store.upsert(body, _now(), origin="api")
    audit.info("schedule %s %s by %s (%s)", body.id, outcome, caller.name, body.spec.describe())
    found = out(request, await store.get(body.id))
    return JSONResponse(
        found.model_dump(mode="json"), status_code=201 if outcome == "created" else 200
    )


@router.get("/schedules", response_model=list[ScheduleOut], responses=errors(*READ_ERRORS))
async def list_schedules(
    request: Request,
    store: StoreDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    after: Annotated[
        Annotated[str, StorableText(max_length=120)],
        Query(description="The last id of the page before."),
    ] = "",
) -> list[ScheduleOut]:
    """The schedules in id order, a page at a time."""
    return [out(request, row) for row in await store.list(limit=limit, after=after)]


@router.get(
    "/schedules/{schedule_id}", response_model=ScheduleOut, responses=errors(404, *READ_ERRORS)
)
async def get_schedule(schedule_id: ScheduleId, request: Request, store: StoreDep) -> ScheduleOut:
    return out(request, await store.get(schedule_id))


@router.post(
    "/schedules/{schedule_id}/pause", response_model=ScheduleOut, responses=errors(*_ACT, 409)
)
async def pause_schedule(
    schedule_id: ScheduleId, request: Request, caller: Caller, store: StoreDep
) -> ScheduleOut:
    """Stops firing (409 if paused already)."""
    row = await store.set_state(schedule_id, ScheduleState.PAUSED, _now())
    audit.info("schedule %s paused by %s", schedule_id, caller.name)
    return out(request, row)


@router.post(
    "/schedules/{schedule_id}/resume", response_model=ScheduleOut, responses=errors(*_ACT, 409)
)
async def resume_schedule(
    schedule_id: ScheduleId, request: Request, caller: Caller, store: StoreDep
) -> ScheduleOut:
    """Fires again from the next tick after now; the ticks of the pause are not caught up
    (409 if active already)."""
    row = await store.set_state(schedule_id, ScheduleState.ACTIVE, _now())
    audit.info("schedule %s resumed by %s", schedule_id, caller.name)
    return out(request, row)


@router.delete("/schedules/{schedule_id}", status_code=204, responses=errors(*_ACT))
async def delete_schedule(schedule_id: ScheduleId, caller: Caller, store: StoreDep) -> Response:
    """Deletes the schedule (the sagas it started stay)."""
    await store.delete(schedule_id)
    audit.info("schedule %s deleted by %s", schedule_id, caller.name)
    return Response(status_code=204)


@router.post(
    "/schedules/{schedule_id}/trigger",
    response_model=TriggerResult,
    responses=errors(*_ACT),
)
async def trigger_schedule(
    schedule_id: ScheduleId,
    request: Request,
    caller: Caller,
    store: StoreDep,
    starter: StarterDep,
) -> TriggerResult:
    """Fires the schedule once now, outside its spec and whatever its state, under a saga
    id of its own (``schedule:{id}:trigger:{time}``)."""

    async def fire(firings: Sequence[Firing]) -> None:
        for f in firings:
            await starter(f.saga_type, f.input, idempotency_key=f.idempotency_key)

    firing = await store.trigger(schedule_id, _now(), fire)
    audit.info("schedule %s triggered by %s: saga %s", schedule_id, caller.name, firing.saga_id)
    return TriggerResult(
        schedule_id=schedule_id,
        saga_id=firing.saga_id,
        status_url=_saga_url(request, firing.saga_id),
    )

"""The admin API's batch operations: one operator action on every saga a filter matches.

``POST /batch-operations`` checks everything before recording anything: the filter (the
saga list's filters; a saga type or a search attribute no deployed type declares is a
422), the action, a signal the filter's saga type declares with a payload its model
accepts, a reason (required: it is recorded in every saga's history). ``dry_run`` answers
how many sagas match, recording nothing. The operation itself is run by the workers
(``runner/_batch_operations``); ``GET /batch-operations/{id}`` shows its progress, and ``POST
/batch-operations/{id}/cancel`` stops it (the sagas acted on stay as they are).

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

import logging
import uuid
from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from saga_engine.admin._deps import AdminState, Caller, PartsDep, _state
from saga_engine.admin._http_errors import api_router
from saga_engine.admin._route_helpers import READ_ERRORS, errors
from saga_engine.core.planning._batch_operations import (
    BatchAction,
    BatchFilter,
    BatchSpec,
    BatchState,
    check_spec,
)
from saga_engine.kernel._input_types import StorableText
from saga_engine.kernel._serde import JsonDict
from saga_engine.store._batch_operation_store import SAMPLE, BatchRow, BatchStore, count_matching

__all__ = ["BatchOut", "BatchRequest", "DryRun", "router"]

audit = logging.getLogger("saga_engine.admin.audit")

router = api_router()

OperationId = Annotated[
    Annotated[str, StorableText(min_length=1, max_length=64)],
    Path(description="The operation's id."),
]


class BatchRequest(BaseModel):
    """A batch operation to create (or, with ``dry_run``, to count)."""

    model_config = ConfigDict(extra="forbid")

    filter: BatchFilter = Field(description="The saga list's filters; all must match.")
    action: BatchAction
    reason: Annotated[str, StorableText(strip=True, min_length=1, max_length=1000)] = Field(
        description="Recorded in every saga's history, after the operation's id.",
    )
    signal: Annotated[str, StorableText(min_length=1, max_length=200)] | None = Field(
        default=None, description="The signal (action signal)."
    )
    payload: JsonDict = Field(default_factory=dict, description="The signal's payload.")
    dry_run: bool = Field(default=False, description="Only count the matching sagas.")


class DryRun(BaseModel):
    dry_run: bool = True
    matched: int
    sample: list[str] = Field(description=f"The first {SAMPLE} matching saga ids.")


class BatchOut(BaseModel):
    """An operation, its state and its progress."""

    id: str
    action: BatchAction
    filter: BatchFilter
    reason: str
    signal: str | None
    payload: JsonDict
    principal: str
    state: BatchState
    total: int = Field(description="The sagas the filter matched when it was created.")
    done: int
    acted: int
    skipped: int = Field(description="Already acted on by this operation (after a crash).")
    failed: int
    errors: list[JsonDict]
    engine: str | None = Field(description="The engine working on it now (its lease).")
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


def out(row: BatchRow) -> BatchOut:
    return BatchOut.model_validate(row.as_json())


def _store(request: Request) -> BatchStore:
    state: AdminState = _state(request)
    if state.batches is None:
        raise HTTPException(503, "batch operations are served by a worker's admin API")
    return state.batches


StoreDep = Annotated[BatchStore, Depends(_store)]


def _now() -> datetime:
    return datetime.now(UTC)


@router.post(
    "/batch-operations",
    status_code=201,
    response_model=BatchOut,
    responses={
        200: {"model": DryRun, "description": "A dry run: how many sagas match now."},
        **errors(400, 401, 403, 413, 422, 503),
    },
)
async def create_batch(
    body: BatchRequest, caller: Caller, parts: PartsDep, store: StoreDep
) -> Response:
    """Creates a batch operation (or counts its sagas, ``dry_run``); the workers run it,
    at most ``batches.rate_per_s`` sagas a second, acting on each saga at most once."""
    spec = BatchSpec(
        filter=body.filter,
        action=body.action,
        reason=body.reason,
        signal=body.signal,
        payload=body.payload,
    )
    check_spec(spec, parts.registry)  # InvalidPayload: a 422 naming the field
    matched, sample = await count_matching(parts.store, body.filter)
    if body.dry_run:
        return JSONResponse(DryRun(matched=matched, sample=sample).model_dump(mode="json"))
    row = await store.create(str(uuid.uuid4()), spec, caller.name, matched, _now())
    audit.info(
        "batch operation %s (%s on %d sagas) by %s: %r",
        row.operation_id,
        body.action,
        matched,
        caller.name,
        spec.reason,
    )
    return JSONResponse(out(row).model_dump(mode="json"), status_code=201)


@router.get("/batch-operations", response_model=list[BatchOut], responses=errors(*READ_ERRORS))
async def list_batches(
    store: StoreDep, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> list[BatchOut]:
    """The newest operations first."""
    return [out(row) for row in await store.list(limit=limit)]


@router.get(
    "/batch-operations/{operation_id}",
    response_model=BatchOut,
    responses=errors(404, *READ_ERRORS),
)
async def get_batch(operation_id: OperationId, store: StoreDep) -> BatchOut:
    """The operation and its progress."""
    return out(await store.get(operation_id))


@router.post(
    "/batch-operations/{operation_id}/cancel",
    response_model=BatchOut,
    responses=errors(401, 403, 404, 409, 422, 503),
)
async def cancel_batch(operation_id: OperationId, caller: Caller, store: StoreDep) -> BatchOut:
    """Stops the operation: the sagas not reached yet are left alone (409 once it has
    ended)."""
    row = await store.cancel(operation_id, _now())
    audit.info("batch operation %s cancelled by %s", operation_id, caller.name)
    return out(row)

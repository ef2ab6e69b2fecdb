"""The admin API's rerun: ``POST /sagas/{saga_id}/rerun`` starts a new saga of the same
type, with the original's input or an edited one (checked against the input model), and
links it to the original in its ``saga_started`` (``rerun_of``: the original's id, the
principal and the reason), which the lineage, the page and ``saga show`` read.

It is a start like any other (through the same starter as ``POST /sagas/{type}``, so the
partition's owner records it) and idempotent the same way: under its idempotency key, or
one derived from the original's id and the input.

No ``from __future__ import annotations``: FastAPI reads the endpoint's annotations at
runtime.
"""

import logging

from fastapi import Request
from fastapi.responses import JSONResponse

from saga_engine.admin._deps import AdminDep, Caller, PartsDep, StarterDep
from saga_engine.admin._http_errors import api_router, request_fields
from saga_engine.admin._route_helpers import ACTION_ERRORS, SagaIdPath, errors, load, saga_ref
from saga_engine.admin._schemas import RerunAccepted, RerunRequest
from saga_engine.admin._starts import _started, _status_url
from saga_engine.core.history._events import RerunLink, SagaStarted
from saga_engine.core.runtime._start import rerun_key
from saga_engine.kernel._errors import InvalidTransition
from saga_engine.kernel._serde import model_payload

__all__ = ["router"]

audit = logging.getLogger("saga_engine.admin.audit")

router = api_router()


@router.post(
    "/sagas/{saga_id}/rerun",
    status_code=202,
    response_model=RerunAccepted,
    responses=errors(*ACTION_ERRORS),
)
async def rerun(
    saga_id: SagaIdPath,
    body: RerunRequest,
    request: Request,
    caller: Caller,
    parts: PartsDep,
    admin: AdminDep,
    starter: StarterDep,
) -> JSONResponse:
    """Starts a new saga of the original's type, with its input or ``input``, linked to
    the original (``rerun_of``); 202 with the new saga's id (the same request again: the
    same saga, with ``Idempotent-Replayed: true``)."""
    _, events = await load(parts.store, saga_ref(saga_id))
    started = events[0]
    if not isinstance(started, SagaStarted):  # pragma: no cover - a history starts so
        raise InvalidTransition(f"saga {saga_id} has no saga_started event")
    definition = parts.registry.get(started.saga_type)
    given = started.input if body.input is None else body.input
    # Checked here, before the start is sent: a 422 names each field the model refuses,
    # under the request's ``input``.
    with request_fields(("body", "input")):
        value = definition.validate_input(given)
    key = body.idempotency_key or rerun_key(saga_id, model_payload(value))
    link = RerunLink(saga_id=saga_id, principal=caller.name, reason=body.reason)
    new_id, replayed = await _started(
        definition, given, key, {"rerun_of": link}, parts.store, starter, admin
    )
    audit.info(
        "rerun saga %s as %s by %s (idempotency key %r): %r",
        saga_id,
        new_id,
        caller.name,
        key,
        body.reason,
    )
    status = None
    record = await parts.store.get(new_id) if replayed else None
    if record is not None:
        status = record.status
    accepted = RerunAccepted(
        saga_id=new_id, status_url=_status_url(request, new_id), status=status, rerun_of=saga_id
    )
    headers = {"Idempotent-Replayed": "true"} if replayed else None
    return JSONResponse(accepted.model_dump(mode="json"), status_code=202, headers=headers)

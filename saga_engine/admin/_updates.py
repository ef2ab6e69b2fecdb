"""The admin API's updates and queries on one saga (``@update`` and ``@query`` methods).

``POST /sagas/{id}/updates/{name}`` calls an update and answers with its recorded result
(the same ``update_id`` twice is applied once, and answered the same); an update the
saga's state refuses is a 409 with the reason, an unknown name or a bad input a 422, an
ended saga a 409. ``GET /sagas/{id}/queries/{name}`` answers a query from the saga's
replayed state and writes nothing; its arguments are the query parameters (or one
``args`` parameter holding a JSON object).

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

import logging
import uuid
from typing import Annotated, Any

from fastapi import Path, Request
from pydantic import BaseModel, Field

from saga_engine.admin._deps import Caller, EngineDep
from saga_engine.admin._http_errors import api_router, request_fields
from saga_engine.admin._route_helpers import (
    ACTION_ERRORS,
    READ_ERRORS,
    SagaIdPath,
    errors,
    saga_ref,
)
from saga_engine.admin._schemas import Name as IdText
from saga_engine.admin._schemas import OptionalReason
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.history._structs import to_data
from saga_engine.kernel._errors import InvalidPayload, SerializationError
from saga_engine.kernel._input_types import StorableText
from saga_engine.kernel._serde import loads

__all__ = ["router"]

audit = logging.getLogger("saga_engine.admin.audit")

router = api_router()

Name = Annotated[
    Annotated[
        str, StorableText(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    ],
    Path(description="The update's or query's name."),
]


class UpdateRequest(BaseModel):
    model_config = {"extra": "forbid", "frozen": True}

    input: dict[str, Any] = Field(
        default_factory=dict, description="The update's input (its model's JSON)."
    )
    update_id: IdText | None = Field(
        default=None,
        description="The same id twice is applied once (and answered the same); generated "
        "if absent.",
    )
    reason: OptionalReason = Field(
        default="", description="Why the operator sends it (recorded and audited)."
    )


class UpdateResult(BaseModel):
    saga_id: str
    name: str
    update_id: str
    principal: str
    status: SagaStatus = Field(description="The saga's status right after the update.")
    result: Any = Field(default=None, description="What the update's handler returned.")
    error: dict[str, Any] | None = Field(
        default=None,
        description="The error the handler raised (the update is recorded as failed).",
    )


class QueryResult(BaseModel):
    saga_id: str
    name: str
    result: Any = Field(description="What the query returned, from the saga's replayed state.")


@router.post(
    "/sagas/{saga_id}/updates/{name}",
    response_model=UpdateResult,
    responses=errors(*ACTION_ERRORS),
)
async def update(
    saga_id: SagaIdPath, name: Name, body: UpdateRequest, caller: Caller, engine: EngineDep
) -> UpdateResult:
    """Calls the saga's update ``name`` and returns its result (or the error its
    handler raised). Refused by the saga's state: 409 with the reason, nothing recorded."""
    update_id = body.update_id or str(uuid.uuid4())
    # The engine names the update's input ``payload`` and its name ``name``: the request
    # carries them as ``input`` and in the path.
    with request_fields(payload=("body", "input"), name=("path", "name")):
        answer = await engine.update(
            saga_ref(saga_id),
            name,
            body.input,
            update_id=update_id,
            principal=caller.name,
            reason=body.reason,
        )
    audit.info(
        "update %r (id %s) of saga %s by %s: %r", name, update_id, saga_id, caller.name, body.reason
    )
    record = await engine.get(saga_id)
    return UpdateResult(
        saga_id=saga_id,
        name=name,
        update_id=update_id,
        principal=caller.name,
        status=record.status,
        result=answer.result,
        error=to_data(answer.error) if answer.error else None,
    )


@router.get(
    "/sagas/{saga_id}/queries/{name}",
    response_model=QueryResult,
    responses=errors(*READ_ERRORS, 404, 409),
)
async def query(
    saga_id: SagaIdPath, name: Name, request: Request, engine: EngineDep
) -> QueryResult:
    """Answers the saga's query ``name`` from its replayed state (nothing is written).
    Its arguments: the query parameters, or ``args`` holding a JSON object."""
    params = dict(request.query_params)
    args = query_args(params)
    # The engine names the arguments ``args``: the request carries them as the query
    # parameters, or as the one parameter ``args``.
    where = ("query", "args") if "args" in params else ("query",)
    with request_fields(args=where, name=("path", "name")):
        result = await engine.query(saga_ref(saga_id), name, args)
    return QueryResult(saga_id=saga_id, name=name, result=result)


def query_args(params: dict[str, str]) -> dict[str, Any]:
    """A query's arguments from the URL: ``args`` (a JSON object) or the parameters."""
    if "args" not in params:
        return dict(params)
    try:
        args = loads(params.pop("args"))
    except SerializationError:
        args = None
    if not isinstance(args, dict) or params:
        raise InvalidPayload(
            "the query's arguments",
            [
                {
                    "loc": ["query", "args"],
                    "type": "json_object",
                    "msg": "args must be a JSON object, and the only parameter when given",
                }
            ],
        )
    return args

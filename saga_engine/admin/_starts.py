"""The admin API's start: ``POST /sagas/{type}``, with Idempotency-Key and ``wait``.

Unlike the other routers this one is built per app (:func:`starts_router`): its
declaration depends on the app's engine and settings (the saga-type enum, the bound on
``wait``), which FastAPI turns into the OpenAPI description and the 422 checks when the
route is declared. The engine, settings and start function still reach the endpoint
through the dependencies, like everywhere else.

No ``from __future__ import annotations``: FastAPI reads the endpoint's annotations at
runtime, and they refer to :func:`starts_router`'s arguments.
"""

import asyncio
import logging
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Header, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, Response

from saga_engine.admin._deps import AdminDep, Caller, EngineDep, PartsDep, StarterDep, StartSaga
from saga_engine.admin._route_helpers import ACTION_ERRORS, errors, load
from saga_engine.admin._schemas import ErrorBody, SagaDetail, StartAccepted
from saga_engine.admin._views import awaited, detail
from saga_engine.core.authoring._definition import SagaDefinition
from saga_engine.core.history._decision import saga_id_for
from saga_engine.core.history._events import SagaStarted
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import (
    IdempotencyConflict,
    SagaNotFound,
    SerializationError,
    UnstorableValue,
)
from saga_engine.kernel._input_types import StorableText, Text
from saga_engine.kernel._serde import loads
from saga_engine.kernel._settings import AdminSettings
from saga_engine.runner._engine import Engine
from saga_engine.runner._parts import EngineParts
from saga_engine.store._store import EventStore, SagaRecord

__all__ = ["starts_router"]

audit = logging.getLogger("saga_engine.admin.audit")


def _status_url(request: Request, saga_id: str) -> str:
    return f"{request.scope.get('root_path', '')}/sagas/{quote(saga_id, safe='')}"


async def _json_object(request: Request) -> dict[str, Any]:
    content_type = request.headers.get("content-type", "application/json").lower()
    media = content_type.split(";")[0].strip()
    if media != "application/json" and not media.endswith("+json"):
        raise HTTPException(415, f"send the body as application/json, not {media!r}")
    raw = await request.body()
    if not raw.strip():
        raise HTTPException(422, "the body must be a JSON object: the saga's input")
    try:
        data = loads(raw)
    except UnstorableValue:
        raise  # nested too deep to read: a 422, as from every edge
    except SerializationError as exc:
        raise HTTPException(400, str(exc)) from None
    if not isinstance(data, dict):
        raise HTTPException(422, f"the body must be a JSON object, not {type(data).__name__}")
    return data


async def _settled(engine: Engine, saga_id: str, seconds: float) -> SagaRecord | None:
    """The saga once terminal or parked, or None if it is still moving after ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        try:
            return await engine.wait(saga_id, timeout=max(0.0, deadline - loop.time()))
        except TimeoutError:
            return None
        except SagaNotFound:
            # Started through the inbox: the owning engine has not created it yet.
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(min(0.05, max(0.0, deadline - loop.time())))


async def _recorded_start(store: EventStore, saga_id: str, wait: float = 0.0) -> SagaStarted | None:
    """The saga's ``saga_started``, or None if it does not exist (yet): with ``wait``,
    polls that long for it (a start through the inbox lands a moment later)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        try:
            first = (await store.first_event(saga_id)).event
        except SagaNotFound:
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(0.02)
            continue
        return first if isinstance(first, SagaStarted) else None


IdempotencyKey = Annotated[
    Annotated[str, StorableText(min_length=1, max_length=200)] | None,
    Header(
        alias="Idempotency-Key",
        description="Starting twice with the same key and input starts one saga "
        "(same id; the answer carries `Idempotent-Replayed: true`); the same key with "
        "another input is a 409 naming the saga it started.",
    ),
]
Priority = Annotated[
    int,
    Query(
        ge=-1_000_000,
        le=1_000_000,
        description="Flow control: a higher priority's commands are sent first while "
        "a limit holds commands back.",
    ),
]
FairnessKey = Annotated[
    Annotated[str, StorableText(min_length=1, max_length=200)] | None,
    Query(
        description="Flow control: commands of different keys (tenants) take turns "
        "while a limit holds commands back.",
    ),
]
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": SagaDetail, "description": "With `wait`: the saga, settled."},
    415: {"model": ErrorBody, "description": "The body is not JSON"},
    **errors(*ACTION_ERRORS),
}
_BODY = {
    "requestBody": {
        "required": True,
        "description": "The saga's input, as its input model's JSON (see /saga-types).",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}


def starts_router(type_names: list[str], max_wait_s: float) -> APIRouter:
    """The start route for an engine running ``type_names``, waiting up to ``max_wait_s``."""
    router = APIRouter()
    type_schema: dict[str, Any] = {"enum": type_names} if type_names else {}

    @router.post(
        "/sagas/{saga}",
        status_code=202,
        response_model=StartAccepted,
        responses=_RESPONSES,
        openapi_extra=_BODY,
    )
    async def start(
        saga: Annotated[
            Text, Path(description="The saga type to start.", json_schema_extra=type_schema)
        ],
        request: Request,
        caller: Caller,
        engine: EngineDep,
        parts: PartsDep,
        admin: AdminDep,
        starter: StarterDep,
        idempotency_key: IdempotencyKey = None,
        wait: Annotated[
            float | None,
            Query(
                ge=0,
                le=max_wait_s,
                description="Seconds to wait for the saga to end or park; then 200 with it.",
            ),
        ] = None,
        priority: Priority = 0,
        fairness_key: FairnessKey = None,
    ) -> Response:
        """Starts a saga; 202 with its id and status URL (or, with ``wait``, 200 once it
        has ended or parked)."""
        definition = parts.registry.get(saga)
        body = await _json_object(request)
        # Refused here, before the start is sent anywhere, so a 202 always names a saga
        # that will exist: a value Postgres cannot store, or one the input model refuses,
        # is a 422 naming the field (InvalidPayload, see errors.py). The body goes on as
        # it came: the engine fills in the defaults, and fingerprints what was given.
        definition.validate_input(body)
        # Flow-control options only when given: a custom starter need not know them.
        flow: dict[str, Any] = {"priority": priority} if priority else {}
        if fairness_key is not None:
            flow["fairness_key"] = fairness_key
        saga_id, replayed = await _started(
            definition, body, idempotency_key, flow, parts.store, starter, admin
        )
        audit.info(
            "start %s saga %s by %s (idempotency key %r)",
            definition.name,
            saga_id,
            caller.name,
            idempotency_key,
        )
        return await _answer(request, engine, parts, saga_id, wait, replayed)

    return router


async def _started(
    definition: SagaDefinition,
    body: dict[str, Any],
    idempotency_key: str | None,
    flow: dict[str, Any],
    store: EventStore,
    starter: StartSaga,
    admin: AdminSettings,
) -> tuple[str, bool]:
    """The saga this start names (started now, unless its key's saga exists), and
    whether it repeats an earlier start. Another input under a used key is a 409."""
    if idempotency_key is not None:
        # The key's saga, if it exists: the same request gets it back, another one a
        # 409 naming it (the contract of payment APIs' Idempotency-Key).
        saga_id = saga_id_for(definition.name, idempotency_key)
        started = await _recorded_start(store, saga_id)
        if started is not None:
            if not definition.same_request(started.input, started.request_hash, body):
                raise IdempotencyConflict(saga_id, idempotency_key)
            return saga_id, True
    saga_id = await starter(definition.name, body, idempotency_key=idempotency_key, **flow)
    if idempotency_key is not None:
        # Two requests with one key may both have found no saga: the first start the
        # engine records wins; wait for it, and refuse this one if it lost.
        started = await _recorded_start(store, saga_id, wait=admin.idempotency_confirm_s)
        if started is not None and not definition.same_request(
            started.input, started.request_hash, body
        ):
            raise IdempotencyConflict(saga_id, idempotency_key)
    return saga_id, False


async def _answer(
    request: Request,
    engine: Engine,
    parts: EngineParts,
    saga_id: str,
    wait: float | None,
    replayed: bool,
) -> Response:
    """202 with the saga's id, status URL and status; with ``wait``, 200 and the saga
    once it has ended or parked within it."""
    if wait is not None:
        record = await _settled(engine, saga_id, wait)
        if record is not None:
            record, events = await load(parts.store, saga_id)
            found = detail(record, events, awaited(parts.registry, record, events))
            return JSONResponse(found.model_dump(mode="json"))
    status: SagaStatus | None
    try:
        status = (await engine.get(saga_id)).status
    except SagaNotFound:
        status = None
    accepted = StartAccepted(
        saga_id=saga_id, status_url=_status_url(request, saga_id), status=status
    )
    # Stripe's header: this answer repeats an earlier start instead of making one.
    headers = {"Idempotent-Replayed": "true"} if replayed else None
    return JSONResponse(accepted.model_dump(mode="json"), status_code=202, headers=headers)

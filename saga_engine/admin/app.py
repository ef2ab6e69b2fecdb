"""The admin HTTP API: inspect sagas, start them, and act on them as an operator.

Build it with :func:`create_admin_app` and serve it on the engine's event loop with
:func:`saga_engine.admin.serve_admin`. Its OpenAPI description is at ``/openapi.json``.

No ``from __future__ import annotations`` here: FastAPI reads the endpoints'
annotations at runtime, and they refer to values local to :func:`create_admin_app`.
"""

import asyncio
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPBearer
from pydantic import BeforeValidator

from saga_engine import __version__
from saga_engine._engine import Engine, saga_id_for
from saga_engine._errors import IdempotencyConflict, SagaNotFound, SerializationError
from saga_engine._events import Event, SagaStarted
from saga_engine._serde import loads
from saga_engine._status import SagaStatus
from saga_engine._store import SagaRecord, as_utc, check_lookup
from saga_engine.admin import metrics as metrics_mod
from saga_engine.admin.auth import PRINCIPAL_KEY, AuthMiddleware, Principal, auth_required
from saga_engine.admin.errors import (
    BodyLimitMiddleware,
    CatchAllMiddleware,
    install_error_handlers,
)
from saga_engine.admin.listing import SagaFilter, decode_cursor, list_page
from saga_engine.admin.schemas import (
    ActionResult,
    CancelRequest,
    ErrorBody,
    ForceCompensateRequest,
    Health,
    HistoryDocument,
    MetricsBody,
    ResumeRequest,
    RetryRequest,
    SagaDetail,
    SagaPage,
    SagaTypeInfo,
    SignalRequest,
    SkipRequest,
    StartAccepted,
)
from saga_engine.admin.views import detail, summary
from saga_engine.admin.web import SecurityHeadersMiddleware, web_router
from saga_engine.replay import export_history
from saga_engine.settings import Settings

__all__ = ["StartSaga", "create_admin_app"]

log = logging.getLogger("saga_engine.admin")
audit = logging.getLogger("saga_engine.admin.audit")

#: ``start_saga(saga_type, input, *, idempotency_key=...) -> saga_id``: how the API
#: starts a saga. ``Engine.start`` by default; the worker passes one that goes through
#: the Kafka inbox (``SagaClient.start`` has this shape), so the partition owner starts it.
StartSaga = Callable[..., Awaitable[str]]

_NO_NUL = r"^[^\x00]*$"
_FILENAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


def _iso_only(value: Any) -> Any:
    """Query strings must say ISO-8601: pydantic alone would also read "0.5" as a time."""
    if isinstance(value, str) and not _ISO_DATE.match(value):
        raise ValueError("use an ISO-8601 date-time, e.g. 2030-01-01T00:00:00Z")
    return value


IsoDatetime = Annotated[datetime, BeforeValidator(_iso_only)]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    words = {
        400: "Bad request (malformed JSON, invalid cursor, or an action the engine refuses)",
        401: "No valid bearer token",
        403: "The token's role may not do this",
        404: "No such saga (or saga type)",
        409: "The action makes no sense in the saga's current state",
        413: "The request body is too large",
        422: "Invalid parameters or body",
        503: "The store or broker is unavailable; retry after Retry-After seconds",
    }
    return {c: {"model": ErrorBody, "description": words[c]} for c in codes}


_READ_ERRORS = (401, 422, 503)
_ACTION_ERRORS = (400, 401, 403, 404, 409, 413, 422, 503)


def current_principal(request: Request) -> Principal:
    principal = request.scope.get("state", {}).get(PRINCIPAL_KEY)
    if not isinstance(principal, Principal):  # pragma: no cover - the middleware sets it
        raise RuntimeError("the admin API is served without its AuthMiddleware")
    return principal


def _saga_ref(saga_id: str) -> str:
    """Ids the store can never hold are not found (rather than a database error)."""
    check_lookup(saga_id)
    return saga_id


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
    except SerializationError as exc:
        raise HTTPException(400, str(exc)) from None
    if not isinstance(data, dict):
        raise HTTPException(422, f"the body must be a JSON object, not {type(data).__name__}")
    return data


def create_admin_app(
    engine: Engine, settings: Settings, *, start_saga: StartSaga | None = None
) -> FastAPI:
    """The admin API for ``engine``, configured by ``settings.admin``.

    Raises InsecureAdminBinding (a PermanentError) when ``settings.admin.host`` is not a
    loopback address and no token is configured, and AdminConfigError for weak or
    duplicated tokens.
    """
    admin = settings.admin
    tokens = auth_required(admin)
    starter: StartSaga = start_saga or engine.start
    app = FastAPI(
        title="saga-engine admin API",
        version=__version__,
        description=(
            "Inspect sagas, start them and act on them. Bearer tokens: `reader` tokens may "
            "use every GET, `operator` tokens everything. Operator actions are recorded in "
            "the saga's history with the token's name and the given reason."
        ),
        openapi_url="/openapi.json",
        # The interactive docs pages load their scripts from a CDN: not in an engine.
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    # Outermost last: SecurityHeaders(CatchAll(Auth(BodyLimit(app)))). Auth runs before
    # any body is read; every answer, a 401 or a 500 too, gets the anti-framing headers.
    app.add_middleware(BodyLimitMiddleware, limit=admin.max_body_bytes)
    app.add_middleware(AuthMiddleware, tokens=tokens)
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(SecurityHeadersMiddleware)

    bearer = HTTPBearer(
        auto_error=False,
        description="A token from SAGA_ADMIN__READERS or SAGA_ADMIN__OPERATORS.",
    )
    router = APIRouter(dependencies=[Depends(bearer)])
    type_names = engine.registry.names()
    type_schema: dict[str, Any] = {"enum": type_names} if type_names else {}
    Caller = Annotated[Principal, Depends(current_principal)]

    async def load(saga_id: str) -> tuple[SagaRecord, list[Event]]:
        loaded = await engine.store.load(_saga_ref(saga_id))
        return loaded.record, [stored.event for stored in loaded.events]

    async def settled(saga_id: str, seconds: float) -> SagaRecord | None:
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

    async def recorded_start(saga_id: str, wait: float = 0.0) -> SagaStarted | None:
        """The saga's ``saga_started``, or None if it does not exist (yet): with ``wait``,
        polls that long for it (a start through the inbox lands a moment later)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            try:
                first = (await engine.store.first_event(saga_id)).event
            except SagaNotFound:
                if loop.time() >= deadline:
                    return None
                await asyncio.sleep(0.02)
                continue
            return first if isinstance(first, SagaStarted) else None

    # ------------------------------------------------------------------ reading

    @app.get("/health", response_model=Health, tags=["meta"])
    async def health() -> Health:
        """Liveness: the process and its event loop answer. Needs no token."""
        return Health()

    @router.get("/saga-types", response_model=list[SagaTypeInfo], responses=_errors(401))
    async def saga_types() -> list[SagaTypeInfo]:
        """The saga types this engine can start, with their input and output schemas."""
        return [
            SagaTypeInfo(
                name=d.name,
                input_schema=d.input_type.model_json_schema(),
                output_schema=d.output_type.model_json_schema(),
            )
            for d in sorted(engine.registry, key=lambda d: d.name)
        ]

    @router.get("/sagas", response_model=SagaPage, responses=_errors(400, *_READ_ERRORS))
    async def list_sagas(
        status: Annotated[
            list[SagaStatus] | None, Query(description="Repeat to match any of several.")
        ] = None,
        saga_type: Annotated[
            str | None, Query(alias="type", min_length=1, max_length=100, pattern=_NO_NUL)
        ] = None,
        created_after: Annotated[
            IsoDatetime | None, Query(description="ISO-8601; without an offset, UTC. Inclusive.")
        ] = None,
        created_before: Annotated[IsoDatetime | None, Query(description="Exclusive.")] = None,
        updated_after: Annotated[IsoDatetime | None, Query(description="Inclusive.")] = None,
        updated_before: Annotated[IsoDatetime | None, Query(description="Exclusive.")] = None,
        q: Annotated[
            str | None,
            Query(
                min_length=1,
                max_length=200,
                pattern=_NO_NUL,
                description="A saga id, or its first characters; or an idempotency key.",
            ),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        cursor: Annotated[
            str | None, Query(max_length=2000, description="next_cursor of the previous page.")
        ] = None,
    ) -> SagaPage:
        """Sagas in id order, filtered; page through them with ``cursor``."""
        for low, high, what in (
            (created_after, created_before, "created"),
            (updated_after, updated_before, "updated"),
        ):
            if low is not None and high is not None and as_utc(low) >= as_utc(high):
                raise HTTPException(422, f"{what}_after must be earlier than {what}_before")
        where = SagaFilter(
            statuses=frozenset(status) if status else None,
            saga_type=saga_type,
            created_after=created_after,
            created_before=created_before,
            updated_after=updated_after,
            updated_before=updated_before,
            q=q,
        )
        rows, next_cursor = await list_page(
            engine.store,
            where,
            limit=limit,
            after_id=decode_cursor(cursor) if cursor is not None else None,
        )
        return SagaPage(items=[summary(r) for r in rows], next_cursor=next_cursor)

    @router.get(
        "/sagas/{saga}",
        response_model=SagaDetail,
        name="get_saga",
        responses=_errors(404, *_READ_ERRORS),
    )
    async def get_saga(
        saga: Annotated[str, Path(description="The saga's id.")],
    ) -> SagaDetail:
        """Status, input, output or error, current step, pending compensations, next
        wake-up."""
        record, events = await load(saga)
        return detail(record, events)

    @router.get(
        "/sagas/{saga_id}/history",
        response_model=HistoryDocument,
        responses=_errors(404, *_READ_ERRORS),
    )
    async def history(
        saga_id: str,
        response: Response,
        download: Annotated[
            bool, Query(description="Serve it as a file (Content-Disposition).")
        ] = False,
    ) -> dict[str, Any]:
        """The full event list, as the JSON that ``saga replay`` reads."""
        record, events = await load(saga_id)
        if download:
            name = _FILENAME_UNSAFE.sub("_", record.saga_id)[:120]
            response.headers["Content-Disposition"] = (
                f'attachment; filename="saga-{name}.history.json"'
            )
        return export_history(record.saga_id, record.saga_type, events)

    @router.get(
        "/metrics",
        response_model=MetricsBody,
        responses={
            200: {
                "content": {metrics_mod.PROMETHEUS_CONTENT_TYPE: {"schema": {"type": "string"}}},
                "description": "JSON, or the Prometheus text format for `Accept: text/plain`.",
            },
            **_errors(*_READ_ERRORS),
        },
    )
    async def metrics(
        accept: Annotated[str | None, Header(include_in_schema=False)] = None,
    ) -> MetricsBody | Response:
        """Open sagas by status, the oldest parked saga's age, dead letters, counters."""
        body = await metrics_mod.collect(engine)
        if metrics_mod.wants_text(accept):
            return PlainTextResponse(
                metrics_mod.render_prometheus(body), media_type=metrics_mod.PROMETHEUS_CONTENT_TYPE
            )
        return body

    # ------------------------------------------------------------------ starting

    @router.post(
        "/sagas/{saga}",
        status_code=202,
        response_model=StartAccepted,
        responses={
            200: {"model": SagaDetail, "description": "With `wait`: the saga, settled."},
            415: {"model": ErrorBody, "description": "The body is not JSON"},
            **_errors(*_ACTION_ERRORS),
        },
        openapi_extra={
            "requestBody": {
                "required": True,
                "description": "The saga's input, as its input model's JSON (see /saga-types).",
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        },
    )
    async def start(
        saga: Annotated[
            str,
            Path(description="The saga type to start.", json_schema_extra=type_schema),
        ],
        request: Request,
        caller: Caller,
        idempotency_key: Annotated[
            str | None,
            Header(
                alias="Idempotency-Key",
                min_length=1,
                max_length=200,
                pattern=_NO_NUL,
                description="Starting twice with the same key and input starts one saga "
                "(same id; the answer carries `Idempotent-Replayed: true`); the same key with "
                "another input is a 409 naming the saga it started.",
            ),
        ] = None,
        wait: Annotated[
            float | None,
            Query(
                ge=0,
                le=admin.max_wait_s,
                description="Seconds to wait for the saga to end or park; then 200 with it.",
            ),
        ] = None,
    ) -> Response:
        """Starts a saga; 202 with its id and status URL (or, with ``wait``, 200 once it
        has ended or parked)."""
        definition = engine.registry.get(saga)
        body = await _json_object(request)
        # Refused here, before the start is sent anywhere, so a 202 always names a saga
        # that will exist: a value Postgres cannot store, or one the input model refuses,
        # is a 422 naming the field (InvalidPayload, see errors.py). The body goes on as
        # it came: the engine fills in the defaults, and fingerprints what was given.
        definition.validate_input(body)
        replayed = False
        if idempotency_key is not None:
            # The key's saga, if it exists: the same request gets it back, another one a
            # 409 naming it (the contract of payment APIs' Idempotency-Key).
            saga_id = saga_id_for(definition.name, idempotency_key)
            started = await recorded_start(saga_id)
            if started is not None:
                if not definition.same_request(started.input, started.request_hash, body):
                    raise IdempotencyConflict(saga_id, idempotency_key)
                replayed = True
        if not replayed:
            saga_id = await starter(definition.name, body, idempotency_key=idempotency_key)
            if idempotency_key is not None:
                # Two requests with one key may both have found no saga: the first start
                # the engine records wins; wait for it, and refuse this one if it lost.
                started = await recorded_start(saga_id, wait=admin.idempotency_confirm_s)
                if started is not None and not definition.same_request(
                    started.input, started.request_hash, body
                ):
                    raise IdempotencyConflict(saga_id, idempotency_key)
        audit.info(
            "start %s saga %s by %s (idempotency key %r)",
            definition.name,
            saga_id,
            caller.name,
            idempotency_key,
        )
        if wait is not None:
            record = await settled(saga_id, wait)
            if record is not None:
                record, events = await load(saga_id)
                return JSONResponse(detail(record, events).model_dump(mode="json"))
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

    # ------------------------------------------------------------------ operator actions

    async def done(
        saga_id: str,
        action: Literal["signal", "cancel", "resume", "retry", "skip", "force-compensate"],
        caller: Principal,
        **extra: Any,
    ) -> ActionResult:
        record = await engine.get(saga_id)
        return ActionResult(
            saga_id=saga_id,
            action=action,
            principal=caller.name,
            status=record.status,
            **extra,
        )

    @router.post(
        "/sagas/{saga_id}/signal", response_model=ActionResult, responses=_errors(*_ACTION_ERRORS)
    )
    async def signal(saga_id: str, body: SignalRequest, caller: Caller) -> ActionResult:
        """Delivers a signal (the same ``signal_id`` twice is delivered once)."""
        signal_id = body.signal_id or str(uuid.uuid4())
        decision = await engine.signal(
            _saga_ref(saga_id),
            body.name,
            body.payload,
            signal_id=signal_id,
            principal=caller.name,
            reason=body.reason,
        )
        dropped = decision.dropped.value if decision.dropped is not None else None
        audit.info(
            "signal %r (id %s) to saga %s by %s: %r%s",
            body.name,
            signal_id,
            saga_id,
            caller.name,
            body.reason,
            f" (dropped: {dropped})" if dropped else "",
        )
        return await done(saga_id, "signal", caller, signal_id=signal_id, dropped=dropped)

    @router.post(
        "/sagas/{saga_id}/cancel", response_model=ActionResult, responses=_errors(*_ACTION_ERRORS)
    )
    async def cancel(saga_id: str, body: CancelRequest, caller: Caller) -> ActionResult:
        """Cancels a running saga: it compensates every step it owes, in reverse order."""
        await engine.cancel(_saga_ref(saga_id), body.reason, principal=caller.name)
        audit.info("cancel saga %s by %s: %r", saga_id, caller.name, body.reason)
        return await done(saga_id, "cancel", caller)

    @router.post(
        "/sagas/{saga_id}/resume", response_model=ActionResult, responses=_errors(*_ACTION_ERRORS)
    )
    async def resume(saga_id: str, body: ResumeRequest, caller: Caller) -> ActionResult:
        """Resumes a parked saga: retries its stuck compensation, or goes on with a
        nondeterministic one once the code deployed now replays its history."""
        await engine.resume(_saga_ref(saga_id), principal=caller.name, reason=body.reason)
        audit.info("resume saga %s by %s: %r", saga_id, caller.name, body.reason)
        return await done(saga_id, "resume", caller)

    @router.post(
        "/sagas/{saga_id}/retry", response_model=ActionResult, responses=_errors(*_ACTION_ERRORS)
    )
    async def retry(saga_id: str, body: RetryRequest, caller: Caller) -> ActionResult:
        """Retries a step now: one waiting out its back-off, or a stuck compensation."""
        await engine.retry_step(
            _saga_ref(saga_id), body.step, reason=body.reason, principal=caller.name
        )
        audit.info(
            "retry step %r of saga %s by %s: %r", body.step, saga_id, caller.name, body.reason
        )
        return await done(saga_id, "retry", caller)

    @router.post(
        "/sagas/{saga_id}/skip", response_model=ActionResult, responses=_errors(*_ACTION_ERRORS)
    )
    async def skip(saga_id: str, body: SkipRequest, caller: Caller) -> ActionResult:
        """Skips a step: answers a step awaiting its reply with ``result`` (it will not be
        compensated), or marks a stuck compensation as done by hand."""
        await engine.skip_step(
            _saga_ref(saga_id),
            body.step,
            body.result,
            reason=body.reason,
            principal=caller.name,
        )
        audit.info(
            "skip step %r of saga %s by %s: %r", body.step, saga_id, caller.name, body.reason
        )
        return await done(saga_id, "skip", caller)

    @router.post(
        "/sagas/{saga_id}/force-compensate",
        response_model=ActionResult,
        responses=_errors(*_ACTION_ERRORS),
    )
    async def force_compensate(
        saga_id: str, body: ForceCompensateRequest, caller: Caller
    ) -> ActionResult:
        """Makes a running saga undo what it did so far, in reverse order; it ends
        compensated."""
        await engine.force_compensate(_saga_ref(saga_id), body.reason, principal=caller.name)
        audit.info("force-compensate saga %s by %s: %r", saga_id, caller.name, body.reason)
        return await done(saga_id, "force-compensate", caller)

    app.include_router(router)
    app.include_router(web_router(engine, admin))
    return app

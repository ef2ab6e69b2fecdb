"""Errors as HTTP: every bad input is a 4xx with a JSON ``detail``, never a 500.

- saga_engine errors map by class: SagaNotFound, UnknownSagaType, ScheduleNotFound,
  BatchNotFound and DeadLetterNotFound 404; CallbackTokenInvalid 403; CallbackGone 410
  (CallbackConflict, its subclass, 409); InvalidTransition, IdempotencyConflict,
  ScheduleConflict, NewerVersionError (a saga written by a newer engine: ``reason`` says
  ``newer_event`` or ``unknown_saga_version``), CodecError (an action on a saga whose
  history this process cannot decode) and DeadLetterNotReplayable 409, PayloadTooLarge
  413, SerializationError 422 (InvalidPayload with FastAPI's list of
  ``{"loc": ["body", ...], "msg", "type"}``, so the answer names each wrong field),
  TransientError 503 (with Retry-After), any other PermanentError 400;
- a client that goes away before it sent its whole body costs one WARNING line;
- bodies above the configured size get 413 before they are read (Content-Length) or as
  soon as the streamed bytes pass the limit;
- a JSON body nested deeper than the one limit (``MAX_DEPTH``) is a 422 naming it, on every
  route (:func:`api_router`), not FastAPI's "error parsing the body" 400;
- anything unexpected is logged with its traceback and answered with a generic 500.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any

import fastapi
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from saga_engine.kernel._errors import (
    BatchNotFound,
    CallbackConflict,
    CallbackGone,
    CallbackTokenInvalid,
    CodecError,
    DeadLetterNotFound,
    DeadLetterNotReplayable,
    IdempotencyConflict,
    InvalidPayload,
    InvalidTransition,
    NewerVersionError,
    PayloadTooLarge,
    PermanentError,
    SagaError,
    SagaNotFound,
    ScheduleConflict,
    ScheduleNotFound,
    SerializationError,
    TransientError,
    UnknownSagaType,
)
from saga_engine.kernel._serde import escaped, too_deep

log = logging.getLogger("saga_engine.admin")

RETRY_AFTER_S = 2


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a streamed body passes the limit (FastAPI re-raises
    HTTPExceptions that happen while it reads a body, so the client gets the 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body exceeds the limit of {limit} bytes")


def status_for(exc: SagaError) -> int:
    if isinstance(exc, CallbackTokenInvalid):
        return 403
    if isinstance(exc, CallbackGone) and not isinstance(exc, CallbackConflict):
        return 410
    if isinstance(
        exc,
        SagaNotFound | UnknownSagaType | ScheduleNotFound | BatchNotFound | DeadLetterNotFound,
    ):
        return 404
    if isinstance(
        exc,
        InvalidTransition
        | IdempotencyConflict
        | ScheduleConflict
        | NewerVersionError
        | CodecError
        | DeadLetterNotReplayable,
    ):
        return 409
    if isinstance(exc, PayloadTooLarge):
        return 413
    if isinstance(exc, SerializationError):
        return 422
    if isinstance(exc, TransientError):
        return 503
    if isinstance(exc, PermanentError):
        return 400
    return 400  # StepFailed, SagaCancelled...: not raised by the API's engine calls


async def _saga_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, SagaError)
    status = status_for(exc)
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    if status == 503:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
    body: dict[str, object] = {"detail": str(exc), "error": type(exc).__name__}
    if isinstance(exc, InvalidPayload):
        body = {"detail": invalid_detail(exc), "error": type(exc).__name__, "message": str(exc)}
    elif isinstance(exc, IdempotencyConflict):
        body["saga_id"] = exc.saga_id
    elif isinstance(exc, NewerVersionError):
        body["reason"] = exc.reason  # newer_event or unknown_saga_version
    return JSONResponse(body, status_code=status, headers=headers)


def invalid_detail(
    exc: InvalidPayload,
    under: tuple[str, ...] = ("body",),
    fields: Mapping[str, tuple[str, ...]] | None = None,
) -> list[dict[str, object]]:
    """FastAPI's shape for a 422: each problem under the request's ``loc``, spelled as the
    request spells it: a problem whose first part is a key of ``fields`` (the engine's
    name for a value, e.g. an update's ``payload``) goes under that field's place in the
    request (``("body", "input")``); any other under ``under``."""
    detail: list[dict[str, object]] = []
    for e in exc.errors:
        loc = e["loc"]
        head = loc[0] if loc else None
        if fields and isinstance(head, str) and head in fields:
            spelled = [*fields[head], *loc[1:]]
        else:
            spelled = [*under, *loc]
        detail.append({"loc": spelled, "msg": e["msg"], "type": e["type"]})
    return detail


@contextlib.contextmanager
def request_fields(under: tuple[str, ...] = ("body",), **fields: tuple[str, ...]) -> Iterator[None]:
    """Names the fields of an InvalidPayload raised inside as the request spells them
    (see :func:`invalid_detail`), as FastAPI's own 422 does: ``with
    request_fields(("body", "input")):`` for a value the request carries as ``input``;
    ``payload=("body", "input")`` for one the engine calls ``payload``."""
    try:
        yield
    except InvalidPayload as exc:
        raise RequestValidationError(invalid_detail(exc, under, fields)) from None


async def _request_invalid(request: Request, exc: Exception) -> Response:
    """FastAPI's own 422, without the offending input: it echoes it back, and a value that
    cannot be encoded (an unpaired surrogate) would turn the answer into a 500."""
    assert isinstance(exc, RequestValidationError)
    detail = [
        {
            "loc": [escaped(p) if isinstance(p, str) else p for p in error.get("loc", ())],
            "msg": escaped(str(error.get("msg", ""))),
            "type": error.get("type", ""),
        }
        for error in exc.errors()
    ]
    return JSONResponse({"detail": detail, "error": "ValidationError"}, status_code=422)


class _JsonRequest(Request):
    """A request whose JSON body nested too deep to read is refused as every other edge
    refuses it (``_serde.too_deep``), where FastAPI would answer a vague 400.

    The parser stays FastAPI's (Python's): it keeps an integer beyond 64 bits as it is,
    so that the storable check names its field, where orjson would read a float."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json.loads(body)
            except RecursionError:
                raise fastapi.HTTPException(422, invalid_detail(too_deep())) from None
        return self._json


class _JsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(_JsonRequest(request.scope, request.receive))

        return route


def api_router() -> APIRouter:
    """A router for routes that take a JSON body: read as :class:`_JsonRequest` reads it."""
    return APIRouter(route_class=_JsonRoute)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(SagaError, _saga_error)
    app.add_exception_handler(RequestValidationError, _request_invalid)


class HttpMiddleware:
    """A pure ASGI middleware that acts on HTTP requests only: lifespan and websocket
    scopes pass through untouched, and :meth:`http` gets each HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class BodyLimitMiddleware(HttpMiddleware):
    """413 for bodies over ``limit`` bytes: up front from Content-Length, else while
    streaming (the counting ``receive`` raises BodyTooLarge)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        super().__init__(app)
        self.limit = limit

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                size = -1
            if size < 0:
                await JSONResponse({"detail": "invalid Content-Length"}, status_code=400)(
                    scope, receive, send
                )
                return
            if size > self.limit:
                await JSONResponse({"detail": BodyTooLarge(self.limit).detail}, status_code=413)(
                    scope, receive, send
                )
                return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited, send)


class CatchAllMiddleware(HttpMiddleware):
    """The last line: an unexpected exception becomes a logged, generic 500.

    (Starlette's own handler for ``Exception`` re-raises after answering; this one does
    not, so a bug in one request stays in that request.)
    """

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except ClientDisconnect:
            # Nobody is left to answer, and nothing was done: one line, no traceback.
            log.warning(
                "admin API: the client went away before sending the whole body of %s %s",
                scope["method"],
                scope["path"],
            )
        except Exception:
            log.exception("admin API: unexpected error in %s %s", scope["method"], scope["path"])
            if started:
                raise  # too late for a clean answer: let the server drop the connection
            await JSONResponse(
                {"detail": "internal error; the engine log has the details"}, status_code=500
            )(scope, receive, send)

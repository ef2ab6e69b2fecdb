"""The callback routes: ``POST /callbacks/{token}`` and ``/callbacks/{token}/fail``, the
only write paths open without a bearer token (docs/callbacks.md).

The token is the credential: signed by this deployment (``callbacks.keys``), bound to one
wait of one saga, and valid until the wait's expiry. Everything is checked before
anything is recorded (``Engine.callback``), and every refusal is a 4xx that changes
nothing: 403 a token not signed here, 410 one expired or whose wait is over, 409 a body
other than the first answer's, 415 a body that is not ``application/json``, 400 one
that is not valid JSON, 422 a body the wait's model
refuses (naming each field), 413 one too large. The first valid body is recorded; the
same body again gets the same answer.

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

import logging
from typing import Annotated, Any, Literal

from fastapi import HTTPException, Path, Request
from pydantic import BaseModel

from saga_engine.admin._deps import EngineDep
from saga_engine.admin._http_errors import api_router
from saga_engine.admin._schemas import ErrorBody
from saga_engine.kernel._callback_tokens import MAX_TOKEN_CHARS

__all__ = ["router"]

audit = logging.getLogger("saga_engine.admin.audit")

router = api_router()

TokenPath = Annotated[
    str,
    Path(
        max_length=MAX_TOKEN_CHARS,
        description="The token of the callback URL the saga handed out (`cb.url`).",
    ),
]

_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": words}
    for code, words in {
        400: "The body is not valid JSON",
        403: "The token was not signed by this deployment (forged, or its key is retired)",
        409: "The wait was answered already with another body: the first answer stands",
        410: "The URL expired, or its wait is over (timed out, given up, the saga ended)",
        413: "The request body is too large",
        415: "The body is not `application/json`",
        422: "The body is not a JSON object, or the wait's model refuses it (each field named)",
        503: "The engine cannot record it now; send it again after Retry-After seconds",
    }.items()
}

_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}


class CallbackResult(BaseModel):
    """What a call completed: the same for a repeat of it."""

    saga_id: str
    wait_id: str
    outcome: Literal["completed", "failed"]


async def _body(request: Request) -> dict[str, Any]:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise HTTPException(415, "a callback's body must be application/json")
    try:
        body = await request.json()
    except ValueError:
        raise HTTPException(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise HTTPException(
            422,
            [{"loc": ["body"], "msg": "a callback's body must be a JSON object", "type": "dict"}],
        )
    return body


async def _complete(
    engine: EngineDep, request: Request, token: str, failed: bool
) -> CallbackResult:
    body = await _body(request)
    answer = await engine.callback(token, body, failed=failed)
    audit.info(
        "callback %s of saga %s %s by its URL",
        answer.wait_id,
        answer.saga_id,
        "failed" if failed else "completed",
    )
    return CallbackResult(
        saga_id=answer.saga_id,
        wait_id=answer.wait_id,
        outcome="failed" if failed else "completed",
    )


@router.post(
    "/callbacks/{token}",
    response_model=CallbackResult,
    responses=_RESPONSES,
    openapi_extra=_BODY,
)
async def complete_callback(
    token: TokenPath, request: Request, engine: EngineDep
) -> CallbackResult:
    """Completes the saga's wait with the body (a JSON object its model reads). No bearer
    token: the signed URL is the credential."""
    return await _complete(engine, request, token, failed=False)


@router.post(
    "/callbacks/{token}/fail",
    response_model=CallbackResult,
    responses=_RESPONSES,
    openapi_extra=_BODY,
)
async def fail_callback(token: TokenPath, request: Request, engine: EngineDep) -> CallbackResult:
    """Reports a failure to the saga's wait (``{"error": "..."}``): its code gets a
    ``CallbackFailed``. No bearer token: the signed URL is the credential."""
    return await _complete(engine, request, token, failed=True)

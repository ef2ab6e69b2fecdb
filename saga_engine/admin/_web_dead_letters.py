"""The web pages of dead letters: ``GET /ui/dead-letters`` lists the newest (time,
reason, detail, origin, saga, offset), filtered by reason; ``GET
/ui/dead-letters/{partition}/{offset}`` shows one whole (payload, headers) with a replay
form for operators.

The form is a plain same-origin post (no script) to ``/ui/dead-letters/{p}/{o}/replay``,
which checks its fields with the API's own body model and calls the API's own route
function (``_dead_letters.replay_dead_letter``: the same replay, the same audit line),
then redirects to the record's page saying where it went (so that reloading it does
not replay it again), or shows the page with why it was refused.
AuthMiddleware has already refused a reader's post or a post from another origin.

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

from typing import Annotated, Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import HTMLResponse, Response
from pydantic import ValidationError

from saga_engine.admin._auth import relative_redirect
from saga_engine.admin._dead_letters import (
    READ_TIMEOUT_S,
    SCAN_PER_PARTITION,
    ReplayRequest,
    replay_dead_letter,
)
from saga_engine.admin._deps import _state, current_principal, page_user
from saga_engine.admin._http_errors import status_for
from saga_engine.admin._web import _render, _root
from saga_engine.kernel._errors import PoisonReason, SagaError
from saga_engine.kernel._input_types import StorableText
from saga_engine.transport._dead_letter import DeadLetter, DeadLetterReader

__all__ = ["dead_letters_page_router"]

PAGE_SIZE = 200
#: Where a replay went, as the redirect after it says (``topic[partition]@offset``).
WENT_TO = r"^[A-Za-z0-9._\-]{1,249}\[\d+\]@\d+$"
#: A replay form is two short fields: anything longer is not one.
MAX_FORM_BYTES = 16 * 1024


def _may_act(request: Request) -> bool:
    user = page_user(request)
    return user is None or user.may_act


def _refused(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())


def dead_letters_page_router() -> APIRouter:
    router = APIRouter(prefix="/ui", include_in_schema=False)

    @router.get("/dead-letters", name="ui_dead_letters")
    async def dead_letters_view(
        request: Request,
        reason: Annotated[Annotated[str, StorableText(max_length=100)], Query()] = "",
    ) -> HTMLResponse:
        return await _listing(request, reason)

    @router.get("/dead-letters/{partition}/{offset}", name="ui_dead_letter")
    async def dead_letter_view(
        request: Request,
        partition: Annotated[int, Path(ge=0)],
        offset: Annotated[int, Path(ge=0)],
        replayed: Annotated[str, Query(max_length=300, pattern=WENT_TO)] = "",
    ) -> HTMLResponse:
        return await _detail(request, partition, offset, replayed=replayed)

    @router.post("/dead-letters/{partition}/{offset}/replay")
    async def replay(
        request: Request,
        partition: Annotated[int, Path(ge=0)],
        offset: Annotated[int, Path(ge=0)],
    ) -> Response:
        return await _replay(request, partition, offset)

    return router


async def _listing(request: Request, reason: str) -> HTMLResponse:
    """The newest dead letters (of ``reason`` if given), newest first."""
    topic = _state(request).dead_letters
    letters: list[DeadLetter] = []
    problem = ""
    if topic is not None:
        try:
            letters = await topic.newest(
                PAGE_SIZE,
                READ_TIMEOUT_S,
                match=(lambda d: d.reason == reason) if reason else None,
                scan=SCAN_PER_PARTITION if reason else None,
            )
        except SagaError as exc:
            problem = str(exc)
    return _render(
        "dead_letters.html",
        status_code=503 if problem else 200,
        root=_root(request),
        user=page_user(request),
        served=topic is not None,
        problem=problem,
        topic=topic.topic if topic is not None else "",
        letters=list(reversed(letters)),
        reasons=[r.value for r in PoisonReason],
        reason=reason,
        quote=quote,
    )


async def _replay(request: Request, partition: int, offset: int) -> Response:
    """The form's fields checked by the API's body model, then the API's own route."""
    topic = _state(request).dead_letters
    form = parse_qs((await request.body())[:MAX_FORM_BYTES].decode(errors="replace"))
    try:
        body = ReplayRequest(
            reason=form.get("reason", [""])[0],
            saga_id=form.get("saga_id", [""])[0].strip() or None,
        )
    except ValidationError as exc:
        return await _detail(request, partition, offset, refused=(422, _refused(exc)))
    if topic is None:
        return await _detail(request, partition, offset)
    try:
        sent = await replay_dead_letter(partition, offset, body, current_principal(request), topic)
    except SagaError as exc:
        return await _detail(request, partition, offset, refused=(status_for(exc), str(exc)))
    done = quote(f"{sent.topic}[{sent.partition}]@{sent.offset}", safe="")
    return relative_redirect(
        request.scope, f"/ui/dead-letters/{partition}/{offset}?replayed={done}"
    )


async def _detail(request: Request, partition: int, offset: int, **outcome: Any) -> HTMLResponse:
    """The page of one dead letter, with what a replay just did (``replayed``) or why it
    was refused (``refused``: status, words)."""
    topic: DeadLetterReader | None = _state(request).dead_letters
    letter: DeadLetter | None = None
    status, problem = 200, ""
    if topic is None:
        status, problem = 503, "Dead letters are read from Kafka: served by a worker's admin API."
    else:
        try:
            letter = await topic.get(partition, offset, READ_TIMEOUT_S)
        except SagaError as exc:
            status, problem = status_for(exc), str(exc)
    refused = outcome.get("refused")
    return _render(
        "dead_letter.html",
        status_code=refused[0] if refused else status,
        root=_root(request),
        user=page_user(request),
        may_act=_may_act(request),
        letter=letter,
        problem=problem,
        partition=partition,
        offset=offset,
        replayed=outcome.get("replayed", ""),
        refused=refused[1] if refused else "",
        quote=quote,
    )

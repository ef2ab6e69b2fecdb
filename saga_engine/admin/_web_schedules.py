"""The web page of durable schedules: ``GET /ui/schedules`` lists them with their spec,
state, next and last runs (the last saga linked to its page), and a pause or resume
button on each (a plain same-origin form: an operator's session, no script).

The buttons post to ``/ui/schedules/{id}/pause|resume``, which act as the API's
routes do and redirect back to the list. AuthMiddleware has already refused a reader's
post or a post from another origin.

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

from datetime import UTC, datetime
from typing import Literal
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from saga_engine.admin._auth import relative_redirect
from saga_engine.admin._deps import _state, page_user
from saga_engine.admin._web import _render, _root
from saga_engine.core._schedule import ScheduleState

__all__ = ["schedules_page_router"]

PAGE_SIZE = 500


def schedules_page_router() -> APIRouter:
    router = APIRouter(prefix="/ui", include_in_schema=False)

    @router.get("/schedules", name="ui_schedules")
    async def schedules_view(request: Request) -> HTMLResponse:
        store = _state(request).schedules
        rows = await store.list(limit=PAGE_SIZE) if store is not None else []
        return _render(
            "schedules.html",
            root=_root(request),
            user=page_user(request),
            served=store is not None,
            schedules=rows,
            quote=quote,
        )

    @router.post("/schedules/{schedule_id}/{action}")
    async def act(
        request: Request, schedule_id: str, action: Literal["pause", "resume"]
    ) -> Response:
        store = _state(request).schedules
        if store is not None:
            state = ScheduleState.PAUSED if action == "pause" else ScheduleState.ACTIVE
            await store.set_state(schedule_id, state, datetime.now(UTC))
        return relative_redirect(request.scope, "/ui/schedules")

    return router

"""The web page of durable schedules: ``GET /ui/schedules`` lists them with their spec,
state, next and last runs, the last saga (linked to its page, with its status), and
buttons to trigger, pause or resume, and delete each.

The buttons are ``form.schedule-action`` forms: ``static/admin.js`` asks to confirm and
calls the admin API's own routes (``_schedules``: the same auth, the same audit log
lines), then reloads. Without a script, they post to
``/ui/schedules/{id}/pause|resume|trigger|delete``, which call those same routes and
redirect back to the list. AuthMiddleware has already refused a reader's post or a post from another
origin.

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

import asyncio
from typing import Literal
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from saga_engine.admin._auth import relative_redirect
from saga_engine.admin._deps import _state, current_principal, page_user
from saga_engine.admin._schedules import (
    delete_schedule,
    pause_schedule,
    resume_schedule,
    trigger_schedule,
)
from saga_engine.admin._web import _render, _root
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import SagaError
from saga_engine.kernel._input_types import Text
from saga_engine.runner._parts import EngineParts

__all__ = ["schedules_page_router"]

PAGE_SIZE = 500


async def _status(parts: EngineParts, saga_id: str | None) -> SagaStatus | None:
    """The last saga's status; None when there is none (or it was removed by retention)."""
    if saga_id is None:
        return None
    try:
        return (await parts.store.get(saga_id)).status
    except SagaError:
        return None


def schedules_page_router() -> APIRouter:
    router = APIRouter(prefix="/ui", include_in_schema=False)

    @router.get("/schedules", name="ui_schedules")
    async def schedules_view(request: Request) -> HTMLResponse:
        state = _state(request)
        store = state.schedules
        rows = await store.list(limit=PAGE_SIZE) if store is not None else []
        statuses = await asyncio.gather(*(_status(state.parts, r.last_saga_id) for r in rows))
        return _render(
            "schedules.html",
            root=_root(request),
            user=page_user(request),
            served=store is not None,
            schedules=list(zip(rows, statuses, strict=True)),
            quote=quote,
        )

    @router.post("/schedules/{schedule_id}/{action}")
    async def act(
        request: Request,
        schedule_id: Text,
        action: Literal["pause", "resume", "trigger", "delete"],
    ) -> Response:
        state = _state(request)
        store, caller = state.schedules, current_principal(request)
        try:
            if store is None:
                pass
            elif action == "trigger":
                await trigger_schedule(schedule_id, request, caller, store, state.start_saga)
            elif action == "delete":
                await delete_schedule(schedule_id, caller, store)
            else:
                route = pause_schedule if action == "pause" else resume_schedule
                await route(schedule_id, request, caller, store)
        except SagaError:
            pass  # paused or resumed already, or deleted meanwhile: the list shows it
        return relative_redirect(request.scope, "/ui/schedules")

    return router

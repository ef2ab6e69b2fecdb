"""The web pages of batch operations: ``GET /ui/batch-operations`` lists them with their
progress, ``GET /ui/batch-operations/{id}`` shows one (its filter, progress bar, counts
and the sagas it failed on, linked), with a cancel button while it runs (a plain
same-origin form: an operator's session, no script). A running operation's page reloads
itself every few seconds.

The button posts to ``/ui/batch-operations/{id}/cancel``, which acts as the API's route
does and redirects back to the page. AuthMiddleware has already refused a reader's post
or a post from another origin.

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

import logging
from datetime import UTC, datetime
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from saga_engine.admin._auth import relative_redirect
from saga_engine.admin._deps import _state, page_user
from saga_engine.admin._web import _render, _root
from saga_engine.kernel._errors import BatchNotFound, InvalidTransition
from saga_engine.kernel._input_types import Text

__all__ = ["batches_page_router"]

audit = logging.getLogger("saga_engine.admin.audit")

PAGE_SIZE = 200


def batches_page_router() -> APIRouter:
    router = APIRouter(prefix="/ui", include_in_schema=False)

    @router.get("/batch-operations", name="ui_batches")
    async def batches_view(request: Request) -> HTMLResponse:
        store = _state(request).batches
        rows = await store.list(limit=PAGE_SIZE) if store is not None else []
        return _render(
            "batches.html",
            root=_root(request),
            user=page_user(request),
            served=store is not None,
            operations=rows,
            quote=quote,
        )

    @router.get("/batch-operations/{operation_id}", name="ui_batch")
    async def batch_view(request: Request, operation_id: Text) -> HTMLResponse:
        store = _state(request).batches
        try:
            row = await store.get(operation_id) if store is not None else None
        except BatchNotFound:
            row = None
        return _render(
            "batch.html",
            status_code=200 if row is not None else 404,
            root=_root(request),
            user=page_user(request),
            op=row,
            operation_id=operation_id,
            quote=quote,
        )

    @router.post("/batch-operations/{operation_id}/cancel")
    async def cancel(request: Request, operation_id: Text) -> Response:
        store = _state(request).batches
        if store is not None:
            try:
                await store.cancel(operation_id, datetime.now(UTC))
            except (BatchNotFound, InvalidTransition):
                pass  # the page shows where it stands
            else:
                who = page_user(request)
                audit.info(
                    "batch operation %s cancelled by %s",
                    operation_id,
                    who.name if who else "anonymous (loopback)",
                )
        return relative_redirect(request.scope, f"/ui/batch-operations/{quote(operation_id)}")

    return router

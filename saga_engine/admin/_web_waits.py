"""The web pages of what sagas wait for besides replies, signals and timers:
``GET /ui/domain-events`` lists the domain events kept (newest first, by source, the
unmatched ones alone), each with the sagas that received it, linked, and its payload;
``GET /ui/concurrency-keys`` lists per saga type and key the sagas holding a slot and
those queued for one (FIFO), linked, filtered by type and key. Both read what the API's
``GET /domain-events`` and ``GET /concurrency-keys`` read; a saga's page links to them
when it waits for an event or for its key. Read only: a reader's session shows them.

No ``from __future__ import annotations``: FastAPI reads the endpoints' annotations at
runtime.
"""

from itertools import groupby
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse

from saga_engine.admin._deps import _state, page_user
from saga_engine.admin._schemas import MissingShard
from saga_engine.admin._web import _blank, _render, _root
from saga_engine.kernel._input_types import StorableText
from saga_engine.store._coverage import coverage
from saga_engine.store._keyslots import KeySlotStore, with_positions

__all__ = ["waits_page_router"]

#: The newest facts shown (the API's own bound is 1000).
PAGE_SIZE = 200

_Filter = Annotated[Annotated[str, StorableText(max_length=200)] | None, Query()]


def _no_nul(*texts: str | None) -> None:
    if any(t is not None and "\x00" in t for t in texts):
        raise HTTPException(422, "filters may not contain NUL characters")


def waits_page_router() -> APIRouter:
    router = APIRouter(prefix="/ui", include_in_schema=False)

    @router.get("/domain-events", name="ui_domain_events")
    async def domain_events_view(
        request: Request, source: _Filter = None, unmatched: bool = False
    ) -> HTMLResponse:
        source = _blank(source)
        _no_nul(source)
        matcher = _state(request).parts.matcher
        facts, receivers = [], {}
        with coverage() as seen:
            if matcher is not None:
                facts = await matcher.store.recent(
                    source=source, unmatched=unmatched, limit=PAGE_SIZE
                )
                receivers = await matcher.store.receivers(facts)
        return _render(
            "domain_events.html",
            root=_root(request),
            user=page_user(request),
            enabled=matcher is not None,
            facts=facts,
            receivers=receivers,
            missing_shards=MissingShard.of(seen),
            source=source or "",
            unmatched=unmatched,
            limit=PAGE_SIZE,
            quote=quote,
        )

    @router.get("/concurrency-keys", name="ui_concurrency_keys")
    async def concurrency_keys_view(
        request: Request,
        saga_type: Annotated[
            Annotated[str, StorableText(max_length=200)] | None, Query(alias="type")
        ] = None,
        key: _Filter = None,
    ) -> HTMLResponse:
        saga_type, key = _blank(saga_type), _blank(key)
        _no_nul(saga_type, key)
        store = _state(request).parts.store
        keyed = isinstance(store, KeySlotStore)
        slots = []
        if isinstance(store, KeySlotStore):
            slots = with_positions(await store.key_slots(saga_type, key))
        # key_slots answers by type and key, holders first, then the queue in FIFO order.
        groups = [
            (group_type, group_key, list(rows))
            for (group_type, group_key), rows in groupby(
                slots, key=lambda row: (row[0].saga_type, row[0].key)
            )
        ]
        return _render(
            "concurrency_keys.html",
            root=_root(request),
            user=page_user(request),
            enabled=keyed,
            groups=groups,
            saga_type=saga_type or "",
            key=key or "",
            types=sorted(_state(request).parts.registry.names()),
            quote=quote,
        )

    return router

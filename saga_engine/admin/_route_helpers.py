"""What the admin API's routers share: documented error answers, id checks, loading."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path

from saga_engine.admin._schemas import ErrorBody
from saga_engine.core.history._codec import Undecodable
from saga_engine.core.history._events import Event
from saga_engine.kernel._input_types import Text
from saga_engine.store._store import EventStore, SagaRecord, check_lookup

__all__ = ["ACTION_ERRORS", "READ_ERRORS", "SagaIdPath", "errors", "load", "saga_ref"]

#: A saga's id in a URL path (an id no store can hold is then a 404, ``saga_ref``).
SagaIdPath = Annotated[Text, Path(description="The saga's id.")]

_WORDS = {
    400: "Bad request (malformed JSON, invalid cursor, or an action the engine refuses)",
    401: "No valid bearer token",
    403: "The token's role may not do this",
    404: "No such saga (or saga type)",
    409: "The action makes no sense in the saga's current state, or the saga was written "
    "by a newer engine (`reason`: newer_event, unknown_saga_version)",
    413: "The request body is too large",
    422: "Invalid parameters or body",
    503: "The store or broker is unavailable; retry after Retry-After seconds",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route answering ``codes`` with an :class:`ErrorBody`."""
    return {c: {"model": ErrorBody, "description": _WORDS[c]} for c in codes}


READ_ERRORS = (401, 422, 503)
ACTION_ERRORS = (400, 401, 403, 404, 409, 413, 422, 503)


def saga_ref(saga_id: str) -> str:
    """Ids the store can never hold are not found (rather than a database error)."""
    check_lookup(saga_id)
    return saga_id


async def load(store: EventStore, saga_id: str) -> tuple[SagaRecord, list[Event]]:
    # An operator's read: a payload this process cannot decode is shown as encrypted
    # (with its key id), not a 500 (docs/operations.md, "Encrypting payloads").
    loaded = await store.load(saga_ref(saga_id), undecodable=Undecodable.SHOW)
    return loaded.record, [stored.event for stored in loaded.events]


async def load_run(store: EventStore, saga_id: str) -> tuple[SagaRecord, list[Event]]:
    """As ``load``, the current run only (``EventStore.load_run``): what an operator's
    view of one saga reads, whatever the length of its life."""
    loaded = await store.load_run(saga_ref(saga_id), undecodable=Undecodable.SHOW)
    return loaded.record, [stored.event for stored in loaded.events]

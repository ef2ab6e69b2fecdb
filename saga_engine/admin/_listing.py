"""Listing sagas: the API's filters and cursors over the store's query.

Every filter is applied by the store, in SQL with an index on Postgres (migration
0004); pages are keyset-paged by saga id, so pagination is exact: every saga matching
the filters is on exactly one page, whatever the page sizes, and a full page is never
followed by an empty one for lack of a budget.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime

from saga_engine.core._definition import LIST_PARAMETERS
from saga_engine.core._status import SagaStatus
from saga_engine.kernel._errors import InvalidCursor, PermanentError
from saga_engine.kernel._serde import dumps, loads
from saga_engine.store._store import EventStore, SagaRecord


def encode_cursor(after_id: str) -> str:
    raw = dumps({"v": 1, "after": after_id})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = loads(raw)
    except (binascii.Error, ValueError, PermanentError):
        data = None
    if not isinstance(data, dict) or data.get("v") != 1 or not isinstance(data.get("after"), str):
        raise InvalidCursor("invalid cursor: pass back the next_cursor of a previous page")
    after: str = data["after"]
    return after


@dataclass(frozen=True, slots=True)
class SagaFilter:
    statuses: frozenset[SagaStatus] | None = None
    saga_type: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    #: An id prefix, or an idempotency key.
    q: str | None = None
    #: Search attributes (``Saga.search_attributes``), all of which must match.
    attributes: tuple[tuple[str, str], ...] = ()


def attribute_filters(
    query: list[tuple[str, str]], declared: set[str]
) -> tuple[tuple[str, str], ...]:
    """The search-attribute filters among a list request's query parameters: those that
    are not the list's own. One no deployed saga type declares is refused (ValueError
    saying which exist): a typo must not list every saga."""
    out: list[tuple[str, str]] = []
    for name, value in query:
        if name in LIST_PARAMETERS:
            continue
        if name not in declared:
            known = ", ".join(sorted(declared)) or "none are declared"
            raise ValueError(
                f"unknown filter {name!r}: the list filters by "
                f"{', '.join(sorted(LIST_PARAMETERS))}, and by the search attributes the "
                f"saga types declare ({known})"
            )
        if "\x00" in value or len(value) > 200:
            raise ValueError(f"filter {name!r}: at most 200 characters, and no NUL")
        out.append((name, value))
    return tuple(out)


async def list_page(
    store: EventStore, where: SagaFilter, *, limit: int, after_id: str | None
) -> tuple[list[SagaRecord], str | None]:
    """One page of matching sagas in id order, and the cursor of the next (or None)."""
    rows = await store.list_sagas(
        statuses=where.statuses,
        saga_type=where.saga_type,
        created_after=where.created_after,
        created_before=where.created_before,
        updated_after=where.updated_after,
        updated_before=where.updated_before,
        search=where.q,
        attributes=dict(where.attributes) or None,
        limit=limit + 1,
        after_id=after_id,
    )
    if len(rows) > limit:
        return rows[:limit], encode_cursor(rows[limit - 1].saga_id)
    return rows, None

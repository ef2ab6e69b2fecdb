"""Listing sagas: the API's filters and cursors over the store's query.

Every filter is applied by the store, in SQL with an index on Postgres (migration
0004); pages are keyset-paged, by saga id or by ``(last activity, saga id)``, so
pagination is exact: every saga matching the filters is on exactly one page, whatever
the page sizes (a saga whose activity moves while one pages may move past the cursor,
as in any keyset over a changing order), and a full page is never followed by an empty
one for lack of a budget.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Final

from saga_engine.admin._schemas import MissingShard, SagaPage, StatusCount
from saga_engine.admin._views import awaited, list_item, view_of
from saga_engine.core.authoring._definition import LIST_PARAMETERS, SagaRegistry
from saga_engine.core.history._status import SagaStatus
from saga_engine.core.views._view import Wait
from saga_engine.kernel._errors import InvalidCursor, PermanentError, SagaError
from saga_engine.kernel._serde import dumps, loads
from saga_engine.store._coverage import coverage
from saga_engine.store._store import EventStore, ListOrder, SagaFilter, SagaRecord, as_utc

#: Each status's count stops here: counting every ended saga of a large table is a
#: scan of its index, and "10000+" tells an operator as much as the exact figure.
COUNT_CAP: Final = 10_000


def encode_cursor(last: SagaRecord, order: ListOrder = "id") -> str:
    if order == "activity":
        body = {"v": 2, "at": as_utc(last.activity_at).isoformat(), "after": last.saga_id}
    else:
        body = {"v": 1, "after": last.saga_id}
    return base64.urlsafe_b64encode(dumps(body)).decode().rstrip("=")


def decode_cursor(cursor: str, order: ListOrder = "id") -> str | tuple[datetime, str]:
    """The id after which an id-ordered page starts, or the ``(activity_at, id)`` after
    which an activity-ordered one does; a cursor of the other order is refused."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = loads(raw)
    except (binascii.Error, ValueError, PermanentError):
        data = None
    version = 2 if order == "activity" else 1
    if isinstance(data, dict) and data.get("v") == version and isinstance(data.get("after"), str):
        after: str = data["after"]
        if version == 1:
            return after
        try:
            return as_utc(datetime.fromisoformat(str(data.get("at")))), after
        except ValueError:
            pass
    raise InvalidCursor(
        "invalid cursor: pass back the next_cursor of a previous page, with the same sort"
    )


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
    store: EventStore,
    where: SagaFilter,
    *,
    limit: int,
    cursor: str | None,
    order: ListOrder = "id",
) -> tuple[list[SagaRecord], str | None]:
    """One page of matching sagas in ``order``, and the cursor of the next (or None)."""
    after = decode_cursor(cursor, order) if cursor is not None else None
    rows = await store.list_sagas(
        where,
        limit=limit + 1,
        after_id=after if isinstance(after, str) else None,
        order=order,
        after_activity=after if isinstance(after, tuple) else None,
    )
    if len(rows) > limit:
        return rows[:limit], encode_cursor(rows[limit - 1], order)
    return rows, None


async def status_counts(store: EventStore, where: SagaFilter) -> dict[SagaStatus, int]:
    """How many sagas match every filter but the status, per status, each up to
    COUNT_CAP: what the status tabs above the list show."""
    return await store.count_by_status(replace(where, statuses=None), cap=COUNT_CAP)


async def waits_of(
    store: EventStore, registry: SagaRegistry, rows: Sequence[SagaRecord]
) -> dict[str, tuple[Wait, ...]]:
    """What each open saga of a page waits for: the detail page's rule (the fold of its
    history, the signals its code awaits), for the page's open sagas only, their
    histories read in one query. A saga whose history cannot be read or decoded here is
    missing (the list shows nothing for it; its page says why)."""
    open_ids = [r.saga_id for r in rows if r.status.is_open]
    if not open_ids:
        return {}
    try:
        loaded = await store.histories(open_ids)
    except (SagaError, ValueError):  # a payload no codec here opens, or none at all
        return {}
    out: dict[str, tuple[Wait, ...]] = {}
    for saga in loaded:
        events = [stored.event for stored in saga.events]
        still = awaited(registry, saga.record, events)
        out[saga.record.saga_id] = view_of(saga.record, events, still).waiting_for
    return out


async def saga_page(
    store: EventStore,
    registry: SagaRegistry,
    where: SagaFilter,
    *,
    limit: int,
    cursor: str | None,
    order: ListOrder,
) -> SagaPage:
    """The API's page (the web page's too): the rows, what the open ones wait for, on
    the first page the counts per status, and the shards (of a sharded store) that did
    not answer: a partial page, never an error, while one shard is down."""
    with coverage() as seen:
        rows, next_cursor = await list_page(store, where, limit=limit, cursor=cursor, order=order)
        waits = await waits_of(store, registry, rows)
        counts = None
        if cursor is None:
            by_status = await status_counts(store, where)
            counts = [
                StatusCount(status=s, count=by_status[s], at_least=by_status[s] >= COUNT_CAP)
                for s in SagaStatus
                if by_status.get(s)
            ]
    return SagaPage(
        items=[list_item(r, waits.get(r.saga_id, ())) for r in rows],
        next_cursor=next_cursor,
        counts=counts,
        missing_shards=MissingShard.of(seen),
    )

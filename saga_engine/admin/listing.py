"""Listing sagas: the store's filters (status, type, id paging) plus the API's own.

The store pages by saga id and filters by status and type. Time ranges and the id
search are applied here, over store pages, with a bounded scan per request: when the
budget runs out the page is returned as it is, with a cursor that continues the scan
where it stopped. Pagination stays exact: every saga matching the filters is on
exactly one page, whatever the page sizes.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime

from saga_engine._errors import PermanentError
from saga_engine._serde import dumps, loads
from saga_engine._status import SagaStatus
from saga_engine._store import EventStore, SagaRecord

STORE_PAGE = 500


class InvalidCursor(PermanentError):
    """A cursor this API did not hand out (or one from an incompatible version)."""


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


def _utc(value: datetime) -> datetime:
    """Naive datetimes are taken as UTC, so they compare with the store's aware ones."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


@dataclass(frozen=True, slots=True)
class SagaFilter:
    statuses: frozenset[SagaStatus] | None = None
    saga_type: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    updated_after: datetime | None = None
    updated_before: datetime | None = None
    q: str | None = None

    @property
    def needs_scan(self) -> bool:
        """Whether some filter is one the store does not apply itself."""
        return any(
            v is not None
            for v in (
                self.created_after,
                self.created_before,
                self.updated_after,
                self.updated_before,
                self.q,
            )
        )

    def matches(self, record: SagaRecord) -> bool:
        created, updated = _utc(record.created_at), _utc(record.updated_at)
        if self.created_after is not None and created < _utc(self.created_after):
            return False
        if self.created_before is not None and created >= _utc(self.created_before):
            return False
        if self.updated_after is not None and updated < _utc(self.updated_after):
            return False
        if self.updated_before is not None and updated >= _utc(self.updated_before):
            return False
        return self.q is None or self.q.casefold() in record.saga_id.casefold()


async def list_page(
    store: EventStore,
    where: SagaFilter,
    *,
    limit: int,
    after_id: str | None,
    scan_limit: int,
) -> tuple[list[SagaRecord], str | None]:
    """One page of matching sagas in id order, and the cursor of the next (or None)."""
    statuses = where.statuses
    if not where.needs_scan:
        rows = await store.list_sagas(
            statuses=statuses, saga_type=where.saga_type, limit=limit + 1, after_id=after_id
        )
        if len(rows) > limit:
            return rows[:limit], encode_cursor(rows[limit - 1].saga_id)
        return rows, None
    found: list[SagaRecord] = []
    scanned = 0
    position = after_id
    while scanned < scan_limit:
        size = min(STORE_PAGE, scan_limit - scanned)
        rows = await store.list_sagas(
            statuses=statuses, saga_type=where.saga_type, limit=size, after_id=position
        )
        for row in rows:
            position = row.saga_id
            scanned += 1
            if where.matches(row):
                found.append(row)
                if len(found) == limit:
                    return found, encode_cursor(position)
        if len(rows) < size:
            return found, None  # the store has nothing more
    # The scan budget is spent: hand back what we have and where to go on from.
    return found, encode_cursor(position) if position is not None else None

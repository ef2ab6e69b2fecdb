"""The Postgres store's listing: the admin list's pages and its counts per status.

Every filter is a predicate SQL answers with an index (migrations 0001, 0004, 0006).
The order by last activity has no index of its own, on purpose: ``updated_at`` changes
at every append, and an index on it would make each of those updates write index
entries (migration 0010 dropped it to keep them HOT). Last activity is
``coalesce(ended_at, updated_at)``, and a saga is either open or ended, so the page is
the merge of two top-N queries: the open sagas (the in-flight set, small, through the
partial index on open statuses, sorted) and the ended ones (the partial ``ended_at``
index, walked backwards).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Final

import asyncpg

from saga_engine.core._codec import CodecChain
from saga_engine.core._status import TERMINAL, SagaStatus
from saga_engine.store._pgbase import (
    _OPEN_STATUSES,
    _RECORD_COLUMNS,
    _json,
    _record,
    _unavailable_as_transient,
)
from saga_engine.store._store import ListOrder, SagaRecord, as_utc

_MAX_CHAR: Final = "\U0010ffff"
#: The saga that started this one (its first event names it, outside any codec): one
#: primary-key lookup per row it is asked of.
_PARENT: Final = (
    "(SELECT e.data -> 'parent' ->> 'saga_id' FROM saga_events e "
    "WHERE e.saga_id = s.saga_id AND e.seq = 1)"
)
#: Literal, not a parameter: the planner proves the partial index's predicate
#: (sagas_open_key_hash_idx, migration 0004) only from the same literal list.
_OPEN_IN: Final = "status IN (" + ", ".join(f"'{s}'" for s in _OPEN_STATUSES) + ")"
_COLUMNS: Final = ", ".join(f"s.{c.strip()}" for c in _RECORD_COLUMNS.split(","))

Arg = Callable[[object], str]


def _filters(
    arg: Arg,
    *,
    saga_type: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    updated_after: datetime | None,
    updated_before: datetime | None,
    search: str | None,
    attributes: Mapping[str, str] | None,
    roots_only: bool,
) -> list[str]:
    # Only the filters given become predicates, so each combination gets a plan that
    # can use the matching index (a catch-all "$1 IS NULL OR ..." query cannot).
    clauses: list[str] = []
    if saga_type is not None:
        clauses.append(f"s.saga_type = {arg(saga_type)}")
    for column, op, value in (
        ("created_at", ">=", created_after),
        ("created_at", "<", created_before),
        ("updated_at", ">=", updated_after),
        ("updated_at", "<", updated_before),
    ):
        if value is not None:
            clauses.append(f"s.{column} {op} {arg(as_utc(value))}::timestamptz")
    if search is not None:
        # An id prefix is a range of the primary key ("C" collation: byte order, and
        # U+10FFFF sorts after every character); a key is its own index.
        low, high = arg(search), arg(search + _MAX_CHAR)
        key = arg(search)
        clauses.append(
            f"((s.saga_id >= {low} AND s.saga_id < {high}) OR s.idempotency_key = {key})"
        )
    if attributes:
        # Containment, which the GIN index on search answers (migration 0006).
        clauses.append(f"s.search @> {arg(_json(dict(attributes)))}::jsonb")
    if roots_only:
        clauses.append(f"{_PARENT} IS NULL")
    return clauses


class PostgresListing:
    """Mixed into PostgresEventStore: the listing, over its pool."""

    _pool: asyncpg.Pool[asyncpg.Record]
    _codec: CodecChain | None

    async def list_sagas(
        self,
        *,
        statuses: Collection[SagaStatus] | None = None,
        saga_type: str | None = None,
        limit: int = 100,
        after_id: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
        search: str | None = None,
        attributes: Mapping[str, str] | None = None,
        order: ListOrder = "id",
        after_activity: tuple[datetime, str] | None = None,
        roots_only: bool = False,
    ) -> list[SagaRecord]:
        args: list[object] = []

        def arg(value: object) -> str:
            args.append(value)
            return f"${len(args)}"

        clauses = _filters(
            arg, saga_type=saga_type, created_after=created_after,
            created_before=created_before, updated_after=updated_after,
            updated_before=updated_before, search=search, attributes=attributes,
            roots_only=roots_only,
        )  # fmt: skip
        wanted = None if statuses is None else sorted({SagaStatus(s).value for s in statuses})
        if order == "activity":
            sql = _by_activity(arg, clauses, wanted, limit, after_activity)
        else:
            if wanted is not None:
                clauses.append(f"s.status = ANY({arg(wanted)}::text[])")
            if after_id is not None:
                clauses.append(f"s.saga_id > {arg(after_id)}")
            where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
            sql = (
                f"SELECT {_COLUMNS}, {_PARENT} AS parent_id FROM sagas s {where}"
                f"ORDER BY s.saga_id LIMIT {arg(limit)}"
            )
        if sql is None:
            return []
        with _unavailable_as_transient():
            rows = await self._pool.fetch(sql, *args)
        return [_listed(r, self._codec) for r in rows]

    async def count_by_status(
        self,
        *,
        cap: int,
        saga_type: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
        search: str | None = None,
        attributes: Mapping[str, str] | None = None,
        roots_only: bool = False,
    ) -> dict[SagaStatus, int]:
        args: list[object] = []

        def arg(value: object) -> str:
            args.append(value)
            return f"${len(args)}"

        clauses = _filters(
            arg, saga_type=saga_type, created_after=created_after,
            created_before=created_before, updated_after=updated_after,
            updated_before=updated_before, search=search, attributes=attributes,
            roots_only=roots_only,
        )  # fmt: skip
        # One capped count per status, each its own branch with the status a literal
        # (the planner then estimates each: a range of (status, saga_id), migration 0004,
        # or of a filter's index), stopping after cap rows: bounded work however many
        # sagas have ended, where a plain GROUP BY counts them all (bench/README.md).
        # A correlated "status = outer.status" got one generic plan: a scan per status.
        extra = "".join(f" AND {c}" for c in clauses)
        limit = arg(cap)
        sql = " UNION ALL ".join(
            f"SELECT '{status.value}' AS status, (SELECT count(*) FROM (SELECT 1 FROM sagas s "
            f"WHERE s.status = '{status.value}'{extra} LIMIT {limit}) AS capped) AS n"
            for status in SagaStatus
        )
        with _unavailable_as_transient():
            rows = await self._pool.fetch(sql, *args)
        return {SagaStatus(r["status"]): int(r["n"]) for r in rows if r["n"]}


def _by_activity(
    arg: Arg,
    clauses: list[str],
    wanted: list[str] | None,
    limit: int,
    after: tuple[datetime, str] | None,
) -> str | None:
    """UNION ALL of the open and the ended sagas' top ``limit``, merged and cut: each
    branch is keyset-paged by ``(its time, saga_id)`` below the cursor. The cursor's
    time is written ``t <= $at AND (t < $at OR id < $id)`` so that the ended branch's
    bound is a range of its index (a row comparison is not, on a one-column index)."""
    branches = []
    for time, scope, statuses in (
        ("s.updated_at", _OPEN_IN, [s.value for s in SagaStatus if s.is_open]),
        ("s.ended_at", "s.ended_at IS NOT NULL", [s.value for s in TERMINAL]),
    ):
        mine = list(clauses)
        if wanted is not None:
            kept = [s for s in wanted if s in statuses]
            if not kept:
                continue
            mine.append(f"s.status = ANY({arg(kept)}::text[])")
        if after is not None:
            at, after_id = arg(as_utc(after[0])), arg(after[1])
            mine.append(
                f"{time} <= {at}::timestamptz AND ({time} < {at} OR s.saga_id < {after_id})"
            )
        where = " AND ".join([scope, *mine])
        branches.append(
            f"(SELECT {_COLUMNS}, {_PARENT} AS parent_id, {time} AS activity_at "
            f"FROM sagas s WHERE {where} ORDER BY {time} DESC, s.saga_id DESC "
            f"LIMIT {arg(limit)})"
        )
    if not branches:
        return None
    return (
        f"SELECT * FROM ({' UNION ALL '.join(branches)}) AS merged "
        f"ORDER BY activity_at DESC, saga_id DESC LIMIT {arg(limit)}"
    )


def _listed(row: asyncpg.Record, codec: CodecChain | None) -> SagaRecord:
    record = _record(row, codec)
    parent: str | None = row["parent_id"]
    return record if parent is None else replace(record, parent_id=parent)

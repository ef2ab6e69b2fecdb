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

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Final

import asyncpg

from saga_engine.core.history._codec import CodecChain
from saga_engine.core.history._status import TERMINAL, SagaStatus
from saga_engine.store._pgbase import (
    _OPEN_STATUSES,
    _RECORD_COLUMNS,
    _json,
    _record,
    _unavailable_as_transient,
    first_event_sql,
)
from saga_engine.store._store import EVERY_SAGA, ListOrder, SagaFilter, SagaRecord, as_utc

_MAX_CHAR: Final = "\U0010ffff"
#: The saga that started this one (its first event names it, outside any codec): one
#: primary-key lookup per row it is asked of.
_PARENT: Final = first_event_sql("-> 'parent' ->> 'saga_id'")
#: The open sagas: a range of (status, saga_id) per open status (sagas_status_id_idx,
#: migration 0004; 0025 dropped the partial index on them that this literal list matched).
_OPEN_IN: Final = "status IN (" + ", ".join(f"'{s}'" for s in _OPEN_STATUSES) + ")"
_COLUMNS: Final = ", ".join(f"s.{c.strip()}" for c in _RECORD_COLUMNS.split(","))


class _Args:
    """A query's parameters: ``arg(value)`` adds one and returns its placeholder."""

    def __init__(self) -> None:
        self.values: list[object] = []

    def __call__(self, value: object) -> str:
        self.values.append(value)
        return f"${len(self.values)}"


Arg = Callable[[object], str]


def _filters(arg: Arg, where: SagaFilter) -> list[str]:
    """Every filter of ``where`` but its statuses (each query places those itself), as
    predicates on ``sagas s``."""
    # Only the filters given become predicates, so each combination gets a plan that
    # can use the matching index (a catch-all "$1 IS NULL OR ..." query cannot).
    clauses: list[str] = []
    if where.saga_type is not None:
        clauses.append(f"s.saga_type = {arg(where.saga_type)}")
    for column, op, value in (
        ("created_at", ">=", where.created_after),
        ("created_at", "<", where.created_before),
        ("updated_at", ">=", where.updated_after),
        ("updated_at", "<", where.updated_before),
    ):
        if value is not None:
            clauses.append(f"s.{column} {op} {arg(as_utc(value))}::timestamptz")
    if where.search is not None:
        # An id prefix is a range of the primary key ("C" collation: byte order, and
        # U+10FFFF sorts after every character); a key is its own index.
        low, high = arg(where.search), arg(where.search + _MAX_CHAR)
        key = arg(where.search)
        clauses.append(
            f"((s.saga_id >= {low} AND s.saga_id < {high}) OR s.idempotency_key = {key})"
        )
    if where.attributes:
        # Containment, which the GIN index on search answers (migration 0006).
        clauses.append(f"s.search @> {arg(_json(dict(where.attributes)))}::jsonb")
    if where.roots_only:
        clauses.append(f"{_PARENT} IS NULL")
    return clauses


class PostgresListing:
    """Mixed into PostgresEventStore: the listing, over its pool."""

    _pool: asyncpg.Pool[asyncpg.Record]
    _codec: CodecChain | None

    async def list_sagas(
        self,
        where: SagaFilter = EVERY_SAGA,
        *,
        limit: int = 100,
        after_id: str | None = None,
        order: ListOrder = "id",
        after_activity: tuple[datetime, str] | None = None,
    ) -> list[SagaRecord]:
        arg = _Args()
        clauses = _filters(arg, where)
        wanted = None if where.statuses is None else sorted(s.value for s in where.statuses)
        if order == "activity":
            sql = _by_activity(arg, clauses, wanted, limit, after_activity)
        else:
            if wanted is not None:
                clauses.append(f"s.status = ANY({arg(wanted)}::text[])")
            if after_id is not None:
                clauses.append(f"s.saga_id > {arg(after_id)}")
            condition = f"WHERE {' AND '.join(clauses)} " if clauses else ""
            sql = (
                f"SELECT {_COLUMNS}, {_PARENT} AS parent_id FROM sagas s {condition}"
                f"ORDER BY s.saga_id LIMIT {arg(limit)}"
            )
        if sql is None:
            return []
        with _unavailable_as_transient():
            rows = await self._pool.fetch(sql, *arg.values)
        return [_listed(r, self._codec) for r in rows]

    async def count_by_status(
        self, where: SagaFilter = EVERY_SAGA, *, cap: int
    ) -> dict[SagaStatus, int]:
        arg = _Args()
        extra = "".join(f" AND {c}" for c in _filters(arg, where))
        counted = [s for s in SagaStatus if where.statuses is None or s in where.statuses]
        if not counted:
            return {}
        # One capped count per status, each its own branch with the status a literal
        # (the planner then estimates each: a range of (status, saga_id), migration 0004,
        # or of a filter's index), stopping after cap rows: bounded work however many
        # sagas have ended, where a plain GROUP BY counts them all (bench/README.md).
        # A correlated "status = outer.status" got one generic plan: a scan per status.
        limit = arg(cap)
        sql = " UNION ALL ".join(
            f"SELECT '{status.value}' AS status, (SELECT count(*) FROM (SELECT 1 FROM sagas s "
            f"WHERE s.status = '{status.value}'{extra} LIMIT {limit}) AS capped) AS n"
            for status in counted
        )
        with _unavailable_as_transient():
            rows = await self._pool.fetch(sql, *arg.values)
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

"""The Postgres store's insights (migration 0014): written by the group commit, read by
the admin API.

Write: in the transaction that stores a run's terminal event, the run's earlier history
is read as marks (a few plain fields selected by SQL, no payload decoded: the
summary's cost is one index range read per ending saga) and the batch's runs are
added into ``saga_insights`` by one upsert. Read: the window's rows of one type, by
the primary key's range.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Final

import asyncpg

from saga_engine.core._events import TERMINAL_EVENTS, Event
from saga_engine.core._insights import (
    BUCKETS,
    MARK_KINDS,
    Counters,
    Mark,
    RowKey,
    aggregate,
    mark_of,
    summarize,
)
from saga_engine.kernel._serde import dumps
from saga_engine.store._pgbase import _Conn, _EncodedJson, _unavailable_as_transient

# The marks of the ending sagas' histories so far (their new events come from the
# batch). Only the kinds a summary reads; `error` only when it is a plain message (a
# payload codec may have sealed it).
_MARKS: Final = """
SELECT saga_id, kind, (data->>'at')::timestamptz AS at, data->>'step' AS step,
       data->>'command_id' AS command_id, data->>'outcome' AS outcome,
       coalesce(data->>'compensation' = 'true', false) AS compensation,
       CASE WHEN jsonb_typeof(data->'error') = 'string' THEN data->>'error' END AS error,
       data->>'purpose' AS purpose, coalesce(data->>'timer_id', data->>'wait_id') AS wait_id,
       coalesce(data->>'name', data->>'source') AS name, data->>'saga_type' AS saga_type
FROM saga_events
WHERE saga_id = ANY($1::text[]) AND kind = ANY($2::text[])
ORDER BY saga_id, seq
"""

# Adds the batch's rows. The rows come sorted by key, and ON CONFLICT locks the rows it
# updates in input order, so two engines adding to the same buckets lock them in the
# same order and cannot deadlock; the row lock serialises their additions (READ
# COMMITTED re-reads the row it waited for, so no addition is lost).
_UPSERT: Final = """
INSERT INTO saga_insights AS i (saga_type, bucket, facet, key, detail, runs, attempts,
                                successes, refusals, timeouts, compensations, offset_ms, rank_sum,
                                hist)
SELECT u.saga_type, u.bucket, u.facet, u.key, u.detail, u.runs, u.attempts, u.successes,
       u.refusals, u.timeouts, u.compensations, u.offset_ms, u.rank_sum,
       (SELECT array_agg(x::bigint) FROM jsonb_array_elements_text(u.hist) AS x)
FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::bigint[],
            $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[],
            $12::bigint[], $13::bigint[], $14::jsonb[])
     WITH ORDINALITY
     AS u(saga_type, bucket, facet, key, detail, runs, attempts, successes, refusals,
          timeouts, compensations, offset_ms, rank_sum, hist, n)
ORDER BY u.n
ON CONFLICT (saga_type, bucket, facet, key, detail) DO UPDATE SET
    runs = i.runs + excluded.runs,
    attempts = i.attempts + excluded.attempts,
    successes = i.successes + excluded.successes,
    refusals = i.refusals + excluded.refusals,
    timeouts = i.timeouts + excluded.timeouts,
    compensations = i.compensations + excluded.compensations,
    offset_ms = i.offset_ms + excluded.offset_ms,
    rank_sum = i.rank_sum + excluded.rank_sum,
    hist = ARRAY(SELECT a + b FROM unnest(i.hist, excluded.hist) AS h(a, b))
"""

# The window's rows summed per (facet, key, detail) by Postgres, the histograms element
# by element: a handful of rows reach Python however many buckets the window has (a
# week: 2016 per row kind; summing them in Python took longer than the 200 ms budget).
_READ: Final = f"""
SELECT facet, key, detail, sum(runs)::bigint AS runs, sum(attempts)::bigint AS attempts,
       sum(successes)::bigint AS successes, sum(refusals)::bigint AS refusals,
       sum(timeouts)::bigint AS timeouts, sum(compensations)::bigint AS compensations,
       sum(offset_ms)::bigint AS offset_ms, sum(rank_sum)::bigint AS rank_sum,
       ARRAY[{", ".join(f"coalesce(sum(hist[{i}]), 0)" for i in range(1, BUCKETS + 1))}]::bigint[]
           AS hist
FROM saga_insights
WHERE saga_type = $1 AND bucket >= $2 AND bucket < $3
GROUP BY facet, key, detail
"""

# The runs of a type that ended in the window and took longer than the SLA, latest
# first: the ended_at index (migration 0010) walked backwards, each row checked.
_BREACHES: Final = """
SELECT saga_id FROM sagas
WHERE ended_at >= $2 AND ended_at < $3 AND saga_type = $1 AND ended_at - created_at > $4
ORDER BY ended_at DESC
LIMIT $5
"""


def ending(events: Sequence[Event]) -> bool:
    """Whether an append's events end its saga (its run is then summarised)."""
    return any(isinstance(e, TERMINAL_EVENTS) for e in events)


async def add_insights(conn: _Conn, ended: Sequence[tuple[str, Sequence[Event]]]) -> None:
    """Adds the runs ending in this transaction (saga id, the events it appends) to the
    aggregates. The appends' guard rows are locked, so their histories are stable."""
    ended = [(saga_id, events) for saga_id, events in ended if ending(events)]
    if not ended:
        return
    rows = await conn.fetch(_MARKS, [saga_id for saga_id, _ in ended], list(MARK_KINDS))
    marks: dict[str, list[Mark]] = {}
    for r in rows:
        marks.setdefault(r["saga_id"], []).append(
            Mark(
                kind=r["kind"],
                at=r["at"],
                step=r["step"],
                command_id=r["command_id"],
                outcome=r["outcome"],
                compensation=r["compensation"],
                error=r["error"],
                purpose=r["purpose"],
                wait_id=r["wait_id"],
                name=r["name"],
                saga_type=r["saga_type"],
            )
        )
    summaries = []
    for saga_id, events in ended:
        summary = summarize(marks.get(saga_id, []) + [mark_of(e) for e in events])
        if summary is not None:
            summaries.append(summary)
    await upsert(conn, aggregate(summaries))


async def upsert(conn: _Conn, rows: dict[RowKey, Counters]) -> None:
    if not rows:
        return
    keys = sorted(rows)
    cs = [rows[k] for k in keys]
    await conn.execute(
        _UPSERT,
        [k[0] for k in keys],
        [k[1] for k in keys],
        [k[2] for k in keys],
        [k[3] for k in keys],
        [k[4] for k in keys],
        [c.runs for c in cs],
        [c.attempts for c in cs],
        [c.successes for c in cs],
        [c.refusals for c in cs],
        [c.timeouts for c in cs],
        [c.compensations for c in cs],
        [c.offset_ms for c in cs],
        [c.rank_sum for c in cs],
        # Each histogram as one JSON array (a list of lists would be a 2-D array).
        [_EncodedJson(dumps(c.hist)) for c in cs],
    )


class PostgresInsights:
    """Mixed into PostgresEventStore: the insight reads, over its pool."""

    _pool: asyncpg.Pool[asyncpg.Record]

    async def insight_rows(
        self, saga_type: str, since: datetime, until: datetime
    ) -> list[tuple[str, str, str, Counters]]:
        """(facet, key, detail, counters) of the type's buckets in [since, until), summed
        per (facet, key, detail)."""
        with _unavailable_as_transient():
            rows = await self._pool.fetch(_READ, saga_type, since, until)
        return [
            (
                r["facet"],
                r["key"],
                r["detail"],
                Counters(
                    runs=r["runs"],
                    attempts=r["attempts"],
                    successes=r["successes"],
                    refusals=r["refusals"],
                    timeouts=r["timeouts"],
                    compensations=r["compensations"],
                    offset_ms=r["offset_ms"],
                    rank_sum=r["rank_sum"],
                    hist=list(r["hist"]),
                ),
            )
            for r in rows
        ]

    async def sla_breaches(
        self, saga_type: str, since: datetime, until: datetime, sla: timedelta, limit: int = 20
    ) -> list[str]:
        """Ids of the latest runs of the type that ended in [since, until) past ``sla``."""
        with _unavailable_as_transient():
            rows = await self._pool.fetch(_BREACHES, saga_type, since, until, sla, limit)
        return [r["saga_id"] for r in rows]

"""The Postgres store's insights (migrations 0014-0017): recorded by the group commit,
rolled up in the background, read by the admin API.

Write: the transaction that stores runs' terminal events records only the runs' ids, as
one row of ``saga_insights_ended`` (migration 0021). A roll-up (``roll_up_insights``: every engine's housekeeping,
and each read first) takes a batch of those ids, reads their histories as marks (a few
plain fields selected by SQL, no payload decoded), and adds their summaries into
``saga_insights`` by one upsert, deleting the ids in the same transaction: each run is
counted once. Each row is of one flow policy (the one its runs were started under,
migration 0017). Read: the window's rows of one type, by the primary key's range, summed
over every policy or of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from itertools import groupby
from operator import itemgetter
from typing import Final

import asyncpg

from saga_engine.core.history._events import TERMINAL_EVENTS, Event
from saga_engine.core.views._insight_report import LearnedCost, learned_costs
from saga_engine.core.views._insights import (
    BUCKETS,
    MARK_KINDS,
    Counters,
    InsightRow,
    Mark,
    RowKey,
    aggregate,
    summarize,
)
from saga_engine.kernel._serde import dumps
from saga_engine.store._pgbase import (
    _Conn,
    _EncodedJson,
    _unavailable_as_transient,
    first_event_sql,
    history_sql,
)

# The marks of finished runs' histories. Only the kinds a summary reads; `error` only when it is a plain message (a
# payload codec may have sealed it). A reply's timings (written by the engine from a validated model, never a
# participant's raw text) and, for a reply, when its row was stored: the apply phase's end; for a
# start, its flow policy (absent: 1).
_MARKS: Final = f"""
SELECT saga_id, kind, extract(epoch FROM (data->>'at')::timestamptz)::float8 * 1000 AS at, data->>'step' AS step,
       data->>'command_id' AS command_id, data->>'outcome' AS outcome,
       coalesce(data->>'compensation' = 'true', false) AS compensation,
       CASE WHEN jsonb_typeof(data->'error') = 'string' THEN data->>'error' END AS error,
       data->>'purpose' AS purpose, coalesce(data->>'timer_id', data->>'wait_id') AS wait_id,
       coalesce(data->>'name', data->>'source') AS name, data->>'saga_type' AS saga_type,
       extract(epoch FROM (data->'timings'->>'sent_at')::timestamptz)::float8 * 1000 AS sent,
       extract(epoch FROM (data->'timings'->>'received_at')::timestamptz)::float8 * 1000
           AS received,
       extract(epoch FROM (data->'timings'->>'handler_started_at')::timestamptz)::float8 * 1000
           AS handler_start,
       extract(epoch FROM (data->'timings'->>'handler_ended_at')::timestamptz)::float8 * 1000
           AS handler_end,
       extract(epoch FROM (data->'timings'->>'committed_at')::timestamptz)::float8 * 1000
           AS committed,
       (data->'timings'->>'handler_cpu_ms')::float8 AS cpu_ms,
       CASE WHEN kind = 'reply_received'
            THEN extract(epoch FROM recorded_at)::float8 * 1000 END AS recorded,
       CASE WHEN kind = 'saga_started' THEN (data->>'flow_policy')::int END AS flow_policy,
       coalesce(kind = 'callback_received' AND data->>'failed' = 'true', false) AS failed
FROM ({history_sql("d.saga_id = ANY($1::text[]) AND d.kinds && $2::text[]")}) AS h
WHERE kind = ANY($2::text[])
ORDER BY saga_id, seq
"""

# The runs a transaction ends, as one row (migration 0021): one insert, however many.
_ENDED: Final = "INSERT INTO saga_insights_ended (saga_ids) VALUES ($1::text[])"

# Takes the runs waiting for the roll-up: up to $1 rows of saga_insights_ended (each the
# runs one transaction ended, at least one) and up to $1 rows of saga_insights_pending
# (one run each, recorded by an engine of an older release, migration 0015): at least $1
# runs when there are that many, so a take that returns fewer took every row it could.
# The rows are deleted by the transaction that adds their runs, so a crash before its
# commit leaves them waiting. In the background, SKIP LOCKED: two engines rolling up at
# once take disjoint runs instead of waiting on each other. Before a read, a plain FOR
# UPDATE: the read waits for a roll-up in progress to commit (READ COMMITTED then skips
# the rows it deleted, and LIMIT counts only the rows locked), so what the read returns
# counts every run that ended before it began.
_TAKE: Final = """
WITH ended AS (
    DELETE FROM saga_insights_ended
    WHERE ctid = ANY(ARRAY(SELECT ctid FROM saga_insights_ended LIMIT $1 FOR UPDATE{0}))
    RETURNING saga_ids
), legacy AS (
    DELETE FROM saga_insights_pending
    WHERE ctid = ANY(ARRAY(SELECT ctid FROM saga_insights_pending LIMIT $1 FOR UPDATE{0}))
    RETURNING saga_id
)
SELECT unnest(saga_ids) AS saga_id FROM ended
UNION ALL
SELECT saga_id FROM legacy
"""
_TAKE_SKIPPING: Final = _TAKE.format(" SKIP LOCKED")
_TAKE_WAITING: Final = _TAKE.format("")
#: Runs added per roll-up transaction.
ROLLUP_BATCH: Final = 2000
#: A read rolls up at most this many batches first (a backlog past it is left to the
#: background roll-ups, and the read is that far behind).
_READ_ROLLUPS: Final = 20

# Adds the batch's rows. The rows come sorted by key, and ON CONFLICT locks the rows it
# updates in input order, so two engines adding to the same buckets lock them in the
# same order and cannot deadlock; the row lock serialises their additions (READ
# COMMITTED re-reads the row it waited for, so no addition is lost).
_UPSERT: Final = """
INSERT INTO saga_insights AS i (saga_type, bucket, facet, key, detail, flow_policy, runs,
                                attempts, successes, refusals, timeouts, compensations,
                                offset_ms, rank_sum, hist, total_us)
SELECT u.saga_type, u.bucket, u.facet, u.key, u.detail, u.flow_policy, u.runs, u.attempts,
       u.successes, u.refusals, u.timeouts, u.compensations, u.offset_ms, u.rank_sum,
       (SELECT array_agg(x::bigint) FROM jsonb_array_elements_text(u.hist) AS x), u.total_us
FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::int[],
            $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[],
            $12::bigint[], $13::bigint[], $14::bigint[], $15::jsonb[], $16::bigint[])
     WITH ORDINALITY
     AS u(saga_type, bucket, facet, key, detail, flow_policy, runs, attempts, successes,
          refusals, timeouts, compensations, offset_ms, rank_sum, hist, total_us, n)
ORDER BY u.n
ON CONFLICT (saga_type, bucket, facet, key, detail, flow_policy) DO UPDATE SET
    runs = i.runs + excluded.runs,
    attempts = i.attempts + excluded.attempts,
    successes = i.successes + excluded.successes,
    refusals = i.refusals + excluded.refusals,
    timeouts = i.timeouts + excluded.timeouts,
    compensations = i.compensations + excluded.compensations,
    offset_ms = i.offset_ms + excluded.offset_ms,
    rank_sum = i.rank_sum + excluded.rank_sum,
    hist = ARRAY(SELECT a + b FROM unnest(i.hist, excluded.hist) AS h(a, b)),
    total_us = i.total_us + excluded.total_us
"""

# The window's rows summed per (facet, key, detail) by Postgres, the histograms element
# by element: a handful of rows reach Python however many buckets the window has (a
# week: 2016 per row kind; summing them in Python took longer than the 200 ms budget).
# Over every flow policy ($4 null) or of one.
_READ: Final = f"""
SELECT facet, key, detail, sum(runs)::bigint AS runs, sum(attempts)::bigint AS attempts,
       sum(successes)::bigint AS successes, sum(refusals)::bigint AS refusals,
       sum(timeouts)::bigint AS timeouts, sum(compensations)::bigint AS compensations,
       sum(offset_ms)::bigint AS offset_ms, sum(rank_sum)::bigint AS rank_sum,
       sum(total_us)::bigint AS total_us,
       ARRAY[{", ".join(f"coalesce(sum(hist[{i}]), 0)" for i in range(1, BUCKETS + 1))}]::bigint[]
           AS hist
FROM saga_insights
WHERE saga_type = $1 AND bucket >= $2 AND bucket < $3
  AND ($4::int IS NULL OR flow_policy = $4)
GROUP BY facet, key, detail
"""

# The flow policies whose runs ended in the window, with their runs (the 'type' rows).
_POLICIES: Final = """
SELECT flow_policy, sum(runs)::bigint AS runs
FROM saga_insights
WHERE saga_type = $1 AND bucket >= $2 AND bucket < $3 AND facet = 'type'
GROUP BY flow_policy
ORDER BY flow_policy
"""

# The runs of a type that ended in the window and took longer than the SLA, latest
# first: the ended_at index (migration 0010) walked backwards, each row checked; of one
# flow policy ($6; null: any), read off the run's first event (its start).
_BREACHES: Final = f"""
SELECT s.saga_id FROM sagas s
WHERE s.ended_at >= $2 AND s.ended_at < $3 AND s.saga_type = $1
  AND s.ended_at - s.created_at > $4
  AND ($6::int IS NULL OR $6 = coalesce(
      ({first_event_sql("->> 'flow_policy'")})::int, 1))
ORDER BY s.ended_at DESC
LIMIT $5
"""


def ends_saga(events: Sequence[Event]) -> bool:
    """Whether an append's events end its saga (its run is then summarised)."""
    return any(isinstance(e, TERMINAL_EVENTS) for e in events)


async def record_ended(conn: _Conn, saga_ids: list[str]) -> None:
    """Records the runs ending in this transaction for the next roll-up (one row)."""
    if saga_ids:
        await conn.execute(_ENDED, saga_ids)


async def add_insights(conn: _Conn, saga_ids: Sequence[str]) -> None:
    """Adds the finished runs ``saga_ids`` to the aggregates (their histories are whole:
    nothing is appended after a terminal event that a summary reads)."""
    rows = await conn.fetch(_MARKS, list(saga_ids), list(MARK_KINDS))
    # A run's rows come together (_MARKS orders by saga id); by position: _MARKS selects
    # the saga id, then Mark's fields in their order.
    summaries = (summarize([Mark(*r[1:]) for r in run]) for _, run in groupby(rows, _saga_id))
    await upsert(conn, aggregate(s for s in summaries if s is not None))


_saga_id: Final = itemgetter(0)


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
        [k[5] for k in keys],
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
        [c.total_us for c in cs],
    )


class PostgresInsights:
    """Mixed into PostgresEventStore: the roll-up and the insight reads, over its pool."""

    _pool: asyncpg.Pool[asyncpg.Record]

    async def roll_up_insights(self, limit: int = ROLLUP_BATCH) -> int:
        """Adds the runs that ended since the last roll-up to the aggregates, those of up
        to ``limit`` transactions that ended runs (at least ``limit`` runs when there are
        that many), skipping those another roll-up holds; returns how many it added."""
        return await self._roll_up(_TAKE_SKIPPING, limit)

    async def _roll_up(self, take: str, limit: int) -> int:
        # READ COMMITTED (the server's default, said here): _TAKE_WAITING's re-check of a
        # row another roll-up deleted relies on it.
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn, conn.transaction(isolation="read_committed"):
                ids = [r["saga_id"] for r in await conn.fetch(take, limit)]
                # A row holds the runs of one transaction: read in batches of a take's size.
                for first in range(0, len(ids), limit):
                    await add_insights(conn, ids[first : first + limit])
        return len(ids)

    async def _caught_up(self) -> None:
        """Rolls up the runs ended so far before a read (up to ``_READ_ROLLUPS`` batches)."""
        for _ in range(_READ_ROLLUPS):
            if await self._roll_up(_TAKE_WAITING, ROLLUP_BATCH) < ROLLUP_BATCH:
                break

    async def insight_rows(
        self, saga_type: str, since: datetime, until: datetime, flow_policy: int | None = None
    ) -> list[InsightRow]:
        """(facet, key, detail, counters) of the type's buckets in [since, until), summed
        per (facet, key, detail): over every flow policy (None), or of one; the runs
        ended so far are rolled up first."""
        await self._caught_up()
        with _unavailable_as_transient():
            rows = await self._pool.fetch(_READ, saga_type, since, until, flow_policy)
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
                    total_us=r["total_us"],
                ),
            )
            for r in rows
        ]

    async def insight_policies(
        self, saga_type: str, since: datetime, until: datetime
    ) -> dict[int, int]:
        """The flow policies of the type's runs that ended in [since, until), with how
        many each, by version; the runs ended so far are rolled up first."""
        await self._caught_up()
        with _unavailable_as_transient():
            rows = await self._pool.fetch(_POLICIES, saga_type, since, until)
        return {r["flow_policy"]: r["runs"] for r in rows}

    async def learned_costs(
        self, saga_type: str, since: datetime, until: datetime
    ) -> dict[str, LearnedCost]:
        """Each step's learned cost in [since, until), by step (``learned_costs``)."""
        return learned_costs(saga_type, await self.insight_rows(saga_type, since, until))

    async def sla_breaches(
        self,
        saga_type: str,
        since: datetime,
        until: datetime,
        sla: timedelta,
        limit: int = 20,
        flow_policy: int | None = None,
    ) -> list[str]:
        """Ids of the latest runs of the type that ended in [since, until) past ``sla``
        (of one flow policy, or of any: None)."""
        with _unavailable_as_transient():
            rows = await self._pool.fetch(
                _BREACHES, saga_type, since, until, sla, limit, flow_policy
            )
        return [r["saga_id"] for r in rows]

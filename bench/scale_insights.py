"""Scale, part ``insights``: ``GET /saga-types/{name}/insights`` over a million runs.

    python -m bench.scale --part insights [--finished 1000000] [--requests 100]

A fresh migrated schema gets, written by SQL: ``--finished`` finished runs of one type
(rows of ``sagas`` with their end times, spread over the last 7 days, 1% past the
type's SLA), the aggregates of those runs in ``saga_insights`` (per five-minute bucket:
the outcomes with their duration histograms computed from the rows, and six nodes, their
errors and one parallel pair with synthetic figures: a read's cost is the rows it reads,
buckets x facets, not the values in them), and a second type with the same aggregates
whose runs almost never breach (10 in the window: the breaching-runs query's worst
case). Then the endpoint is called in-process through httpx for each window, each
``--requests`` times. Target: p99 <= 200 ms for the week.
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
from pydantic import SecretStr

from bench.app import Transfer
from bench.e2e import BenchError, Resources, say
from bench.failover import target
from saga_engine import Settings
from saga_engine.admin import create_admin_app
from saga_engine.core.views._insights import BOUNDS_MS
from saga_engine.runner._engine import Engine
from saga_engine.runner._parts import EngineParts
from saga_engine.settings import PostgresSettings
from saga_engine.store._migrations import migrate
from saga_engine.store._pgstore import PostgresEventStore

#: The issue's target for a type with a million runs in the window.
INSIGHTS_P99_MS = 200.0
WINDOWS = ("1h", "1d", "7d")


class Promised(Transfer):
    name = "promised-transfer"
    sla = timedelta(minutes=1)


class Rarely(Transfer):
    name = "rarely-late"
    sla = timedelta(minutes=1)


# Finished runs over the last 7 days; durations 1-50 s, `late` of them 2-10 minutes.
SEED_RUNS = """
INSERT INTO sagas (saga_id, saga_type, status, last_seq, created_at, updated_at, ended_at,
                   key_hash)
SELECT id, $4, status, 9, ended - dur, ended, ended, hashtext(id) & 2147483647
FROM (
    SELECT gen_random_uuid()::text AS id,
           CASE WHEN r2 < 0.97 THEN 'completed' WHEN r2 < 0.99 THEN 'compensated'
                ELSE 'failed' END AS status,
           $3::timestamptz - r1 * interval '7 days' AS ended,
           CASE WHEN r3 < $5 THEN make_interval(secs => 120 + r4 * 480)
                ELSE make_interval(secs => 1 + r4 * 49) END AS dur
    FROM (SELECT random() AS r1, random() AS r2, random() AS r3, random() AS r4
          FROM generate_series($1::int, $2::int)) AS r
) AS s
"""

# The outcomes' aggregates, from the rows above: per bucket and outcome, the runs and
# their duration histogram (bucket i counts durations up to BOUNDS_MS[i]).
SEED_TYPE_ROWS = """
INSERT INTO saga_insights (saga_type, bucket, facet, key, detail, runs, hist)
SELECT saga_type, bucket, 'type', status, '', sum(n),
       array_agg(n ORDER BY hb)
FROM (
    SELECT g.saga_type, g.bucket, g.status, h.hb, coalesce(c.n, 0) AS n
    FROM (SELECT DISTINCT saga_type, date_bin('5 minutes', ended_at, 'epoch') AS bucket, status
          FROM sagas WHERE saga_type = $1) AS g
    CROSS JOIN generate_series(0, $2::int - 1) AS h(hb)
    LEFT JOIN (
        SELECT date_bin('5 minutes', ended_at, 'epoch') AS bucket, status,
               width_bucket(extract(epoch FROM ended_at - created_at) * 1000, $3::float8[]) AS hb,
               count(*) AS n
        FROM sagas WHERE saga_type = $1 GROUP BY 1, 2, 3
    ) AS c ON c.bucket = g.bucket AND c.status = g.status AND c.hb = h.hb
) AS grid
GROUP BY saga_type, bucket, status
"""

# Six nodes, their errors and one parallel pair per bucket, synthetic figures.
SEED_NODE_ROWS = """
INSERT INTO saga_insights (saga_type, bucket, facet, key, detail, runs, attempts, successes,
                           refusals, timeouts, compensations, offset_ms, rank_sum, hist)
SELECT t.saga_type, t.bucket, 'node', 'step-' || k, 'step', t.runs, t.runs + t.runs / 20,
       t.runs - t.runs / 50, t.runs / 50, t.runs / 100, t.runs / 60, t.runs * 1000 * k,
       t.runs * k,
       array_fill(0::bigint, ARRAY[5]) || ARRAY[t.runs / 2, t.runs / 4, t.runs / 4]
           || array_fill(0::bigint, ARRAY[$2::int - 8])
FROM (SELECT saga_type, bucket, sum(runs) AS runs FROM saga_insights
      WHERE saga_type = $1 AND facet = 'type' GROUP BY 1, 2) AS t
CROSS JOIN generate_series(1, 6) AS k
"""
SEED_OTHER_ROWS = """
INSERT INTO saga_insights (saga_type, bucket, facet, key, detail, runs, hist)
SELECT i.saga_type, i.bucket, f.facet, f.key, f.detail, i.runs / 100,
       array_fill(0::bigint, ARRAY[$2::int])
FROM saga_insights AS i
CROSS JOIN (VALUES ('error', 'step-3', 'declined'), ('error', 'step-3', 'timeout'),
                   ('error', 'step-5', 'out of stock'), ('overlap', 'step-2', 'step-3'))
           AS f(facet, key, detail)
WHERE i.saga_type = $1 AND i.facet = 'node' AND i.key = 'step-1'
"""
COPY_AGGREGATES = """
INSERT INTO saga_insights
SELECT $2, bucket, facet, key, detail, runs, attempts, successes, refusals, timeouts,
       compensations, offset_ms, rank_sum, hist
FROM saga_insights WHERE saga_type = $1
"""


async def _seed(conn: asyncpg.Connection[Any], runs: int, now: datetime) -> dict[str, Any]:
    t0 = time.perf_counter()
    await conn.execute("SELECT setseed(0.27)")
    chunk = 100_000
    for lo in range(1, runs + 1, chunk):
        hi = min(runs, lo + chunk - 1)
        await conn.execute(SEED_RUNS, lo, hi, now, Promised.name, 0.01)
        say(f"  {hi:,} runs")
    # The other type: ten late runs in the week, nothing else stored for it (its
    # aggregates are the first type's, so its breaches query walks the whole window).
    await conn.execute(SEED_RUNS, 1, 10, now, Rarely.name, 1.0)
    runs_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    buckets = len(BOUNDS_MS) + 1
    await conn.execute(SEED_TYPE_ROWS, Promised.name, buckets, [float(b) for b in BOUNDS_MS])
    await conn.execute(SEED_NODE_ROWS, Promised.name, buckets)
    await conn.execute(SEED_OTHER_ROWS, Promised.name, buckets)
    await conn.execute(COPY_AGGREGATES, Promised.name, Rarely.name)
    await conn.execute("ANALYZE sagas; ANALYZE saga_insights")
    rows = await conn.fetchval(
        "SELECT count(*) FROM saga_insights WHERE saga_type = $1", Promised.name
    )
    counted = await conn.fetchval(
        "SELECT sum(runs) FROM saga_insights WHERE saga_type = $1 AND facet = 'type'",
        Promised.name,
    )
    if counted != runs:
        raise BenchError(f"the aggregates count {counted} runs, not {runs}")
    return {
        "runs_s": round(runs_s, 2),
        "aggregates_s": round(time.perf_counter() - t0, 2),
        "aggregate_rows_per_type": rows,
    }


async def part_insights(args: argparse.Namespace, res: Resources) -> dict[str, Any]:
    # Imported here: bench.scale imports this module for its --part choice.
    from bench.scale import NoSender, timed

    schema = f"bench_{uuid.uuid4().hex[:8]}_insights"
    res.schemas.append(schema)
    say(f"insights: schema {schema}, {args.finished:,} runs in the last 7 days")
    await migrate(res.dsn, schema)
    pg = PostgresSettings(dsn=SecretStr(res.dsn), db_schema=schema)
    settings = Settings(pg=pg)
    store = await PostgresEventStore.connect(pg)
    conn = await asyncpg.connect(res.dsn, timeout=10, server_settings={"search_path": schema})
    try:
        seeding = await _seed(conn, args.finished, datetime.now(UTC))
        say(f"seeded: {seeding}")
        parts = EngineParts.build(
            settings, sagas=[Promised, Rarely], store=store, sender=NoSender()
        )
        engine = Engine(parts)
        app = create_admin_app(engine, settings, parts=parts)
        out: dict[str, Any] = {}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://admin") as http:
            for name in (Promised.name, Rarely.name):
                for window in WINDOWS:

                    async def call(name: str = name, window: str = window) -> Any:
                        r = await http.get(
                            f"/saga-types/{name}/insights", params={"window": window}
                        )
                        if r.status_code != 200:
                            raise BenchError(f"insights {name} {window}: {r.status_code} {r.text}")
                        return r.json()

                    ms, body = await timed(call, args.requests)
                    key = f"{name}.{window}"
                    out[key] = {
                        "runs": body["runs"],
                        "nodes": len(body["nodes"]),
                        "breached": body["sla"]["breached"],
                        **ms,
                    }
                    say(f"  {key}: {body['runs']:,} runs, p50 {ms['p50']} p99 {ms['p99']} ms")
        await engine.close()
    finally:
        await conn.close()
        await store.close()
    targets = {f"p99_ms.{k}": target(v["p99"], INSIGHTS_P99_MS) for k, v in out.items()}
    return {
        "runs": args.finished,
        "seeding": seeding,
        "api_ms": out,
        "targets": targets,
        "pass": all(t["pass"] for t in targets.values()),
        "schema": schema,
    }

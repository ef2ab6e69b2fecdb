-- 0014_insights: the aggregates behind GET /saga-types/{name}/insights
-- (saga_engine/core/_insights.py, saga_engine/store/_pginsights.py).
--
-- One row per (saga type, five-minute bucket, facet, key, detail), added to by the group
-- commit in the same transaction as the terminal event of each run it counts, so a run
-- is counted exactly once. Facets: 'type' (key: the outcome; runs and the duration
-- histogram), 'node' (key: the node, detail: its kind; runs that took it, attempts,
-- successes, refusals, timeouts, compensations, the sums of its start offsets in ms
-- and of its ranks in its runs (the graph's order) and the latency histogram), 'error'
-- (key: the node, detail: the message; runs = how often), 'overlap' (key, detail: two
-- nodes that ran at the same time in a run). hist: counts per fixed bucket
-- (core/_insights.BOUNDS_MS). A read of a window reads the primary key's range: a week
-- is 2016 buckets per row kind, however many runs they count.
CREATE TABLE saga_insights (
    saga_type     text COLLATE "C" NOT NULL,
    bucket        timestamptz NOT NULL,
    facet         text COLLATE "C" NOT NULL,
    key           text COLLATE "C" NOT NULL,
    detail        text COLLATE "C" NOT NULL,
    runs          bigint NOT NULL DEFAULT 0,
    attempts      bigint NOT NULL DEFAULT 0,
    successes     bigint NOT NULL DEFAULT 0,
    refusals      bigint NOT NULL DEFAULT 0,
    timeouts      bigint NOT NULL DEFAULT 0,
    compensations bigint NOT NULL DEFAULT 0,
    offset_ms     bigint NOT NULL DEFAULT 0,
    rank_sum      bigint NOT NULL DEFAULT 0,
    hist          bigint[] NOT NULL,
    PRIMARY KEY (saga_type, bucket, facet, key, detail)
);

-- 0015_insight_rollup: runs wait here to be added to saga_insights (migration 0014).
--
-- Migration 0014's aggregates were added by the group commit in the terminal event's
-- transaction: the run's history read back, summarised in Python and upserted into rows
-- every run of a type shares (its bucket's), all before the commit. That put a read, a
-- summary and a lock on a hot row into every ending saga's write. Now that transaction
-- only records the ending run's id here; a background roll-up (each engine's
-- housekeeping, and every insights read first) takes a batch of ids with
-- FOR UPDATE SKIP LOCKED, deletes them and adds their summaries to saga_insights in one
-- transaction: each run is still counted exactly once, whichever engine adds it and
-- whatever crashes, and the ending saga's write no longer waits on another engine's
-- aggregate row.
--
-- No index: the roll-up takes any rows, by ctid, and the table holds only the runs
-- ended since the last roll-up (seconds' worth).
CREATE TABLE saga_insights_pending (
    saga_id text COLLATE "C" NOT NULL
);

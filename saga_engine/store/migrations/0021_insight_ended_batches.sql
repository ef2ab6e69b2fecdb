-- 0021_insight_ended_batches: the runs waiting for the insights' roll-up, one row per
-- transaction instead of one per run.
--
-- Migration 0015's saga_insights_pending took a row for every run that ended, which the
-- roll-up then locked and deleted: three WAL records per finished saga, about 8 % of
-- what the store writes for a three-step saga (bench/store_rows.py). The group commit
-- ends many runs in one transaction under load; it now records their ids as one array
-- here, and the roll-up locks and deletes that one row. Each run is still counted
-- exactly once: the row is written in the transaction of the runs' terminal events and
-- deleted in the transaction that adds them.
--
-- saga_insights_pending stays, read by the roll-up beside this table, so that an engine
-- of an older release, still running while this one is deployed, records its ended
-- runs where they are found; a later release drops it.
--
-- No index: the roll-up takes any rows, by ctid, and the table holds only the
-- transactions of the runs ended since the last roll-up.
CREATE TABLE saga_insights_ended (
    saga_ids text[] NOT NULL CHECK (cardinality(saga_ids) > 0)
);

-- 0010_hot_saga_rows: the saga row's update at every append becomes a HOT update.
--
-- Every append updates its saga's row (last_seq is the optimistic guard, current_step
-- the listing's). Postgres can keep such an update on the row's page without writing a
-- new entry into every index of the table (a heap-only tuple) only when no indexed
-- column changes and the page has room. Two did change at almost every append:
--
-- - updated_at, in two indexes (the admin's time filter and the oldest parked saga).
--   Neither needs one: the time filter narrows a listing that pages by id, and parked
--   sagas are found through (status, saga_id). Retention, which did need an index
--   ("finished before", oldest first), gets ended_at: set when a saga ends, and
--   unchanged by the appends of a running saga.
-- - next_wakeup: a step's timeout moves it at every step. The timer poller now reads
--   wake_at, the wake-up rounded down to a 5-second slot (store/_store.py WAKE_GRID):
--   consecutive steps fall in the same slot, and the poller finds a saga at most one
--   slot early (it is then held in memory until its timer fires). next_wakeup stays,
--   exact, for operators, without an index.
--
-- fillfactor leaves half of each page free for the new row versions: a running saga's
-- row gets one per step, and a page keeps them until they are pruned (only pages written
-- from now on: existing ones stay as they are). The table is twice as large; the
-- history (saga_events), many rows per saga, is not touched.
--
-- Measured at 512 sagas in flight (bench/e2e.py, pg_rows_per_saga): the saga row's
-- updates were 0 % HOT, each writing seven index entries; with this, 63 % (of at most
-- 67 %: the last one changes the status), at fillfactor 80 only 33 %.
--
-- ADD COLUMN (no default) is instant, but takes an ACCESS EXCLUSIVE lock held until
-- this migration commits, while the backfill below rewrites the rows that have a
-- wake-up or have ended: seconds per million sagas.
SET LOCAL lock_timeout = '5s';

ALTER TABLE sagas ADD COLUMN wake_at timestamptz;
ALTER TABLE sagas ADD COLUMN ended_at timestamptz;

UPDATE sagas SET wake_at = date_bin('5 seconds', next_wakeup, timestamptz '2000-01-01 00:00:00+00')
WHERE next_wakeup IS NOT NULL;
UPDATE sagas SET ended_at = updated_at
WHERE status IN ('completed', 'compensated', 'failed', 'cancelled');

DROP INDEX sagas_next_wakeup_idx;
DROP INDEX sagas_updated_at_idx;
DROP INDEX sagas_parked_updated_at_idx;

-- The poller: "which sagas wake before T", soonest first, paged by (wake_at, saga_id).
CREATE INDEX sagas_wake_at_idx ON sagas (wake_at, saga_id) WHERE wake_at IS NOT NULL;
-- Retention: "which sagas ended before T", oldest first.
CREATE INDEX sagas_ended_at_idx ON sagas (ended_at) WHERE ended_at IS NOT NULL;

ALTER TABLE sagas SET (fillfactor = 50);

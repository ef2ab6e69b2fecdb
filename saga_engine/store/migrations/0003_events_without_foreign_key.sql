-- 0003_events_without_foreign_key: the history no longer checks its saga row per event.
--
-- The foreign key from saga_events to sagas ran a row-level check for every event
-- inserted: an index probe and a KEY SHARE lock on the saga's row, for a row the same
-- transaction has just locked and updated. Measured on a batch of 320 events it doubled
-- the cost of the INSERT, and the insert of events is the engine's largest statement.
--
-- What the key guarded stays guarded by the write path itself: the store inserts events
-- only for a saga whose row it created or whose last_seq guard it won, in the same
-- transaction, and the primary key (saga_id, seq) still refuses a second event at one
-- position. Nothing deletes sagas or events.
--
-- Dropping a constraint reads and rewrites no row, but it needs an ACCESS EXCLUSIVE lock
-- on both tables. While it waits for one (behind a long transaction: an admin scan, say),
-- every read and write of the tables queues behind it. The lock timeout bounds that stall:
-- past it this migration fails, nothing is changed, and running it again later (the next
-- start, or `saga migrate`) finishes the job.
SET LOCAL lock_timeout = '5s';
ALTER TABLE saga_events DROP CONSTRAINT IF EXISTS saga_events_saga_id_fkey;

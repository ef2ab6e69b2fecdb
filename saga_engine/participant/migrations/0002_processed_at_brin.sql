-- 0002_processed_at_brin: the processing time's index as a BRIN index instead of a btree.
--
-- saga_processed_commands_processed_at_idx (0001) serves one query: the operator's
-- pruning of old rows (DELETE ... WHERE processed_at < T, docs/operations.md), never an
-- order by time. A btree of it took an entry at every command the participant answered:
-- 1 of the ~5 WAL records a command costs, 3 of the ~41 a three-step saga costs end to
-- end (bench/e2e.py --wal-breakdown). Rows are only inserted (the kit writes each
-- outcome once, with its reply) with processed_at = now(), so the heap is in processing
-- order and a block range's minimum and maximum describe it well: a BRIN index answers
-- the same ranges, and an insert into a block range not yet summarised writes nothing to
-- it. autosummarize: a range is summarised by autovacuum once it is full.
--
-- CREATE INDEX takes SHARE on the table (the participant's inserts wait) while it reads
-- it once (BRIN: no sort, seconds per million rows); DROP INDEX takes ACCESS EXCLUSIVE
-- for an instant.
SET LOCAL lock_timeout = '5s';

CREATE INDEX saga_processed_commands_processed_at_brin ON saga_processed_commands
    USING brin (processed_at) WITH (autosummarize = on);
DROP INDEX saga_processed_commands_processed_at_idx;

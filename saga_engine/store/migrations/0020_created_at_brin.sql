-- 0020_created_at_brin: the creation time's index as a BRIN index instead of a btree.
--
-- sagas_created_at_idx (migration 0004) serves one query: the admin listing's
-- created_after/created_before filter, which narrows a listing paged by id (never an
-- order by creation time). A btree of it took an entry at every create and another at
-- the update that ends a saga (a status change is not a HOT update: every index of the
-- row gets an entry): about 2 of the 39 WAL records the store writes per three-step
-- saga (bench/store_rows.py). Sagas are inserted in creation order and a saga's row
-- stays on its page (fillfactor 50, migration 0010), so a block range's minimum and
-- maximum creation time describe it well: a BRIN index answers the same ranges, and an
-- insert into a block range not yet summarised writes nothing to it.
-- autosummarize: a range is summarised by autovacuum once it is full, so a filter on
-- recent times reads only the ranges that can match.
--
-- CREATE INDEX takes SHARE on sagas (writes wait) while it reads the table once (BRIN:
-- no sort, seconds per million sagas); DROP INDEX takes ACCESS EXCLUSIVE for an instant.
SET LOCAL lock_timeout = '5s';

CREATE INDEX sagas_created_at_brin ON sagas USING brin (created_at) WITH (autosummarize = on);
DROP INDEX sagas_created_at_idx;

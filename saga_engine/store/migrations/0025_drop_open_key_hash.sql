-- 0025_drop_open_key_hash: the open sagas found through (status, saga_id) alone.
--
-- sagas_open_key_hash_idx (migration 0004, key_hash of the open sagas) took an entry at
-- every create: 1 of the ~21.6 WAL records the store writes per three-step saga
-- (bench/store_rows.py), and one more at each update that leaves the row's page while
-- the saga is open. Every query it served reads the open sagas as a set, never a range
-- of key_hash (a partition's sagas are "key_hash % N = ANY(...)", a filter, not an index
-- condition): recovery's open_saga_ids (all, or of some partitions), the metrics'
-- open_summary, the activity listing's open branch. sagas_status_id_idx (0004) holds
-- the same set as a range per open status, its leading column; measured on 200,000
-- sagas (5 % open), each of these plans is the same bitmap scan over it, reading the
-- same rows (bench/README.md, 'WAL records per saga, by relation').
--
-- DROP INDEX takes ACCESS EXCLUSIVE on sagas for an instant.
SET LOCAL lock_timeout = '5s';

DROP INDEX sagas_open_key_hash_idx;

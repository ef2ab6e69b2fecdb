-- 0004_queries: indexes that let listing, metrics, recovery and timers ask SQL instead of
-- reading rows into Python.
--
-- key_hash is murmur2(saga_id) & 0x7fffffff, the hash Kafka's default partitioner takes
-- the partition from (partition = key_hash % partitions). The engine sets it when it
-- creates a saga, so "the open sagas of partitions 2 and 5" and "the due timers of my
-- partitions" are one indexed query. Sagas created before this migration have NULL
-- there: the store computes theirs in Python when it meets an open one, and writes it.
--
-- ADD COLUMN takes an ACCESS EXCLUSIVE lock on sagas, held until this migration's
-- transaction commits, so reads and writes of sagas wait while the indexes below are
-- built (a migration runs in a transaction, where CREATE INDEX CONCURRENTLY is not
-- allowed): seconds per million sagas. The lock timeout bounds the wait for the lock.
SET LOCAL lock_timeout = '5s';

ALTER TABLE sagas ADD COLUMN key_hash int;

-- Recovery at partition assignment and the timer poller: open sagas only (most sagas
-- are finished), by hash. Listed by status, as in SagaStatus.is_open.
CREATE INDEX sagas_open_key_hash_idx ON sagas (key_hash)
    WHERE status IN ('running', 'compensating', 'compensation_stuck', 'nondeterministic',
                     'step_stuck');

-- Listing by status is keyset-paged by id: WHERE status = ANY(...) AND saga_id > $cursor
-- ORDER BY saga_id. It replaces (status, updated_at), whose other use, the oldest
-- parked saga, gets a small partial index of its own.
CREATE INDEX sagas_status_id_idx ON sagas (status, saga_id);
DROP INDEX sagas_status_updated_at_idx;
CREATE INDEX sagas_parked_updated_at_idx ON sagas (updated_at)
    WHERE status IN ('compensation_stuck', 'nondeterministic', 'step_stuck');

-- Time ranges of the admin list (created_after/before, updated_after/before).
CREATE INDEX sagas_created_at_idx ON sagas (created_at);
CREATE INDEX sagas_updated_at_idx ON sagas (updated_at);

-- The admin search finds a saga by its idempotency key as well as by its id.
CREATE INDEX sagas_idempotency_key_idx ON sagas (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

"""The statements of the Postgres event store's group commit: one of each per batch of
creates and appends, whatever the batch's size (arrays through ``unnest``)."""

from __future__ import annotations

from typing import Final

INSERT_SAGAS: Final = """
INSERT INTO sagas (saga_id, saga_type, status, last_seq, idempotency_key, created_at,
                   updated_at, current_step, next_wakeup, error, key_hash, search, wake_at,
                   ended_at)
SELECT u.saga_id, u.saga_type, u.status, u.last_seq, u.idempotency_key, u.at, u.at,
       u.current_step, u.next_wakeup, u.error, u.key_hash, u.search, u.wake_at,
       CASE WHEN u.status IN ('completed', 'compensated', 'failed', 'cancelled') THEN u.at END
FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::text[], $6::timestamptz[],
            $7::text[], $8::timestamptz[], $9::jsonb[], $10::int[], $11::jsonb[],
            $12::timestamptz[])
     AS u(saga_id, saga_type, status, last_seq, idempotency_key, at, current_step,
          next_wakeup, error, key_hash, search, wake_at)
-- An id that already exists is not an error but the answer "not created" (False): the
-- row is skipped, so one duplicate does not fail the other creates in the batch, and
-- RETURNING lists only the rows actually inserted: the creates that won. Not ON
-- CONFLICT DO NOTHING: its speculative insertion writes a second WAL record (a
-- confirmation) for every saga created, 1 of the ~34 a three-step saga costs
-- (bench/store_rows.py). An id another transaction is inserting right now is not
-- visible here: the insert waits for it on the primary key, then goes on (it rolled
-- back) or fails with a unique violation (it committed), which the group commit answers
-- by writing each operation alone, where this check then sees the row
-- (PostgresEventStore._attempt; lost_create).
WHERE NOT EXISTS (SELECT 1 FROM sagas AS x WHERE x.saga_id = u.saga_id COLLATE "C")
RETURNING saga_id
"""

# Locks the batch's rows in saga_id order before updating them (see PostgresEventStore._write_appends). The
# caller sorts the ids; the LATERAL subquery refers to the outer row, so the only plan is
# a nested loop that takes the ids in array order and locks each row through the primary
# key as it goes: the lock order is the array's, and the cost stays one index probe per
# id however large the table grows (a plain "= ANY ... ORDER BY" may scan and sort).
LOCK_SAGAS: Final = """
SELECT s.saga_id, s.last_seq
FROM unnest($1::text[]) AS u(saga_id)
CROSS JOIN LATERAL (
    SELECT saga_id, last_seq FROM sagas
    WHERE saga_id = u.saga_id COLLATE "C"  -- the column's collation, so its key is used
    FOR NO KEY UPDATE
) AS s
"""

# The optimistic-concurrency guard, for a whole batch in one statement. A row is updated
# only if its last_seq is still the one the caller expected. RETURNING names the winning
# operations by their position in the batch (WITH ORDINALITY, 1-based), not by saga id,
# so that a winner is known exactly even if a saga appeared twice in one batch.
# While a saga runs, its appends change no indexed column (wake_at moves by whole
# slots, ended_at stays NULL): the update is HOT (migration 0010). ended_at is the time
# of the append that ended it, kept by later appends that leave it ended.
#: The primary key a create that lost to a concurrent create of its id violates.
SAGAS_KEY: Final = "sagas_pkey"

UPDATE_GUARDS: Final = """
UPDATE sagas AS s
SET last_seq = u.new_seq,
    status = u.status,
    current_step = u.current_step,
    next_wakeup = u.next_wakeup,
    wake_at = u.wake_at,
    error = u.error,
    updated_at = coalesce(u.updated_at, s.updated_at),
    ended_at = CASE WHEN u.status IN ('completed', 'compensated', 'failed', 'cancelled')
               THEN coalesce(s.ended_at, u.updated_at, s.updated_at) END
FROM unnest($1::text[], $2::int[], $3::int[], $4::text[], $5::text[], $6::timestamptz[],
            $7::jsonb[], $8::timestamptz[], $9::timestamptz[])
     WITH ORDINALITY
     AS u(saga_id, expected_seq, new_seq, status, current_step, next_wakeup, error,
          updated_at, wake_at, op)
WHERE s.saga_id = u.saga_id AND s.last_seq = u.expected_seq
RETURNING u.op
"""

# The guard above must probe the primary key row by row, whatever the statistics say.
# Until a table's first ANALYZE (a fresh schema: the first minute of a deployment, every
# benchmark) the planner takes `sagas` for a few pages and joins a batch of many sagas
# by hashing a sequential scan of the whole table, once per batch; with these two off it
# can only nest the loop, one index probe per saga (one and two rows it nests anyway).
# LOCAL: they end with the transaction, so reads on the pooled connection keep their plans.
PLAN_GUARDS: Final = "SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off"

SET_SAGA_VERSIONS: Final = """
UPDATE sagas AS s SET saga_version = u.version
FROM unnest($1::text[], $2::int[]) AS u(saga_id, version)
WHERE s.saga_id = u.saga_id
"""

CURRENT_SEQS: Final = "SELECT saga_id, last_seq FROM sagas WHERE saga_id = ANY($1::text[])"

INSERT_EVENTS: Final = """
INSERT INTO saga_events (saga_id, seq, kind, data)
SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::jsonb[])
"""

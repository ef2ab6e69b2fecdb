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

#: The primary key a create that lost to a concurrent create of its id violates.
SAGAS_KEY: Final = "sagas_pkey"

# The optimistic-concurrency guard, for a whole batch in one statement. A row is updated
# only if its last_seq is still the one the caller expected. RETURNING names the winning
# operations by their position in the batch (WITH ORDINALITY, 1-based), not by saga id,
# so that a winner is known exactly even if a saga appeared twice in one batch.
# While a saga runs, its appends change no indexed column (wake_at moves by whole
# slots, ended_at stays NULL): the update is HOT (migration 0010). ended_at is the time
# of the append that ended it, kept by later appends that leave it ended.
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

# The plan of the guard above for a batch of several sagas: a nested loop that takes the
# rows through the primary key, one probe per saga, whatever the statistics say, so that
# it locks them in saga_id order. Two engines' batches that lock overlapping rows (a
# stale owner still writing, say) in one order cannot deadlock. Turned off, every other
# way of reading `sagas` (a sequential or bitmap scan: the heap's order; a hash or merge
# join) costs more than any plan left, and the plans left visit the rows in saga_id
# order: the batch's array outer (the caller sorts it, by code point: the "C" order of
# the column) and a probe of the primary key per saga, or, on a table of a few rows, the
# primary key read whole, in its order (narrower than the two other indexes that could be
# read whole, (saga_type, saga_id) and (status, saga_id), so never dearer). Until a
# table's first ANALYZE (a fresh schema: the first minute of a deployment, every
# benchmark) the planner would otherwise take `sagas` for a few pages and hash a
# sequential scan of the whole table, once per batch. Before, a statement of its own
# locked the rows in order first (SELECT ... FOR NO KEY UPDATE): a WAL record per saga
# per append, 3 of the 33 a three-step saga cost (bench/store_rows.py). Should a plan
# ever lock out of order, the cost is Postgres's deadlock detection: one of the two
# batches fails as a whole with a retryable error, the fencing (last_seq) intact.
# LOCAL: they end with the transaction, so reads on the pooled connection keep their plans.
PLAN_GUARDS: Final = (
    "SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; "
    "SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off"
)

SET_SAGA_VERSIONS: Final = """
UPDATE sagas AS s SET saga_version = u.version
FROM unnest($1::text[], $2::int[]) AS u(saga_id, version)
WHERE s.saga_id = u.saga_id
"""

CURRENT_SEQS: Final = "SELECT saga_id, last_seq FROM sagas WHERE saga_id = ANY($1::text[])"

# The history: one row per winning operation (migration 0022), its events one jsonb
# array, spanning seq..last_seq. A row's kinds come comma-separated (an event kind is a
# snake_case name): a text[] per row cannot be a parameter (Postgres's arrays of arrays
# are rectangular, and unnest flattens them).
INSERT_DECISIONS: Final = """
INSERT INTO saga_decisions (saga_id, seq, last_seq, kinds, events, awaits)
SELECT u.saga_id, u.seq, u.last_seq, string_to_array(u.kinds, ','), u.events, u.awaits
FROM unnest($1::text[], $2::int[], $3::int[], $4::text[], $5::jsonb[], $6::jsonb[])
     AS u(saga_id, seq, last_seq, kinds, events, awaits)
"""

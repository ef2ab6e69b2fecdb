-- 0001_initial: the event store.
--
-- Names are unqualified: the migration runner sets the search_path to the configured
-- schema, so the same file serves any schema. Once released, this file must never
-- change (its sha256 is recorded in schema_migrations and checked at every start);
-- changes go into a new, higher-numbered file.

-- One row per saga: the concurrency guard and the listing projection.
--
-- last_seq is the optimistic-concurrency guard: every append is
--   UPDATE sagas SET last_seq = <new> WHERE saga_id = $1 AND last_seq = <expected>
-- so this row is the one place two writers of the same saga meet. The other columns are
-- a projection of the history, written in the same transaction as the events, so that
-- listing sagas never needs to replay them.
--
-- The ids use the "C" collation: byte order is code-point order, so pages ordered by
-- saga_id come out in the same order as Python's sorted() (and as the in-memory store),
-- whatever the database's default collation is; it also makes comparisons cheaper.
CREATE TABLE sagas (
    saga_id         text COLLATE "C" PRIMARY KEY
                    CHECK (length(saga_id) BETWEEN 1 AND 200),
    saga_type       text COLLATE "C" NOT NULL,
    status          text NOT NULL
                    CHECK (status IN (
                        'running', 'compensating', 'completed', 'compensated',
                        'failed', 'cancelled', 'compensation_stuck', 'nondeterministic'
                    )),
    last_seq        int NOT NULL CHECK (last_seq >= 0),
    idempotency_key text,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    current_step    text,
    next_wakeup     timestamptz,
    error           jsonb
);

-- Operators and recovery ask "which sagas are in status X", usually the oldest first
-- ("compensation_stuck for the longest"); the open-saga scan at partition assignment
-- filters on status too.
CREATE INDEX sagas_status_updated_at_idx ON sagas (status, updated_at);

-- The timer poller asks "which sagas must wake up before T". Most sagas have no pending
-- wakeup, so a partial index stays small and is all the poller reads.
CREATE INDEX sagas_next_wakeup_idx ON sagas (next_wakeup) WHERE next_wakeup IS NOT NULL;

-- Listing one saga type page by page: WHERE saga_type = $1 AND saga_id > $cursor
-- ORDER BY saga_id is a single range scan of this index.
CREATE INDEX sagas_type_id_idx ON sagas (saga_type, saga_id);

-- The history: every event of every saga, append-only.
--
-- The primary key (saga_id, seq) is the second line of defence for dense sequences: even
-- a writer that bypassed the last_seq guard could not store two events at one position.
-- It is also the index load() reads, in seq order. seq starts at 1 (last_seq 0 means an
-- empty history). `data` is the whole event as JSON (kind included, so a row is
-- self-describing); `kind` is repeated as a column so history can be filtered with plain
-- SQL. The foreign key has no ON DELETE action on purpose: deleting a saga that still
-- has a history must be a deliberate, two-step act.
CREATE TABLE saga_events (
    saga_id     text COLLATE "C" NOT NULL REFERENCES sagas (saga_id),
    seq         int NOT NULL CHECK (seq >= 1),
    kind        text NOT NULL,
    data        jsonb NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (saga_id, seq)
);

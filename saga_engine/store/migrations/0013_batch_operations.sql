-- 0013_batch_operations: bulk actions by filter (saga_engine/store/_pgbatches.py).
--
-- One row per operation: what it does (spec: the filter, the action, the reason), its
-- state and its progress. The progress moves saga by saga in saga-id order (cursor: the
-- last saga dealt with), so an engine that takes the operation over after a crash goes
-- on after it; the saga in flight at the crash is read again, and its history says
-- whether the operation already acted on it.
--
-- lease_owner/lease_until: the engine working on it. A claim takes a running row whose
-- lease has expired (FOR UPDATE SKIP LOCKED), and every progress write is conditional on
-- still holding the lease, so an engine that lost it stops.
CREATE TABLE saga_batch_operations (
    operation_id text COLLATE "C" PRIMARY KEY,
    spec         jsonb NOT NULL,
    principal    text NOT NULL,
    state        text NOT NULL,
    total        integer NOT NULL,
    acted        integer NOT NULL DEFAULT 0,
    skipped      integer NOT NULL DEFAULT 0,
    failed       integer NOT NULL DEFAULT 0,
    cursor       text COLLATE "C",
    errors       jsonb NOT NULL DEFAULT '[]',
    lease_owner  text,
    lease_until  timestamptz,
    created_at   timestamptz NOT NULL,
    updated_at   timestamptz NOT NULL,
    finished_at  timestamptz
);

-- The claim's scan: only running operations are indexed.
CREATE INDEX saga_batch_operations_running ON saga_batch_operations (created_at)
    WHERE state = 'running';

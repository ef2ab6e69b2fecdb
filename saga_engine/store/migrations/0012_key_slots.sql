-- 0012_key_slots: per-key concurrency, a semantic lock (docs/concurrency-keys.md).
--
-- One row per saga of a type that declares `concurrency` (ConcurrencyLimit): the key its
-- input gives, whether it holds one of the key's slots (held) or waits for one, and its
-- place in the key's FIFO queue (position, from a sequence). A saga's row is inserted
-- after its saga_started is committed and deleted once its history ends; a sweep deletes
-- the rows of sagas that ended (or were deleted) without it. Granting and promoting run
-- under a transaction-scoped advisory lock on the (saga_type, key) pair, so two engines
-- never both see a free slot (store/_pgkeys.py).
CREATE TABLE saga_key_slots (
    saga_id     text PRIMARY KEY,
    saga_type   text NOT NULL,
    key         text NOT NULL,
    position    bigserial NOT NULL,
    -- The limit the code that queued it declared (promotion uses the head's).
    lim         integer NOT NULL CHECK (lim >= 1),
    held        boolean NOT NULL DEFAULT false,
    queued_at   timestamptz NOT NULL,
    acquired_at timestamptz
);
CREATE INDEX saga_key_slots_key_idx ON saga_key_slots (saga_type, key, position);

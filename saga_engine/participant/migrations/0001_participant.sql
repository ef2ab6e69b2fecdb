-- 0001_participant: a participant service's deduplication table and reply outbox.
--
-- These tables live in the participant's OWN database (never the engine's), so that
-- recording a command as processed commits in the same transaction as the business
-- change it caused. Names are unqualified: the migration runner sets the search_path to
-- the configured schema. Once released, this file must never change (its sha256 is
-- recorded in schema_migrations and checked at every start); changes go into a new,
-- higher-numbered file.

-- One row per command applied (or refused) by this participant: the received-messages
-- table of the outbox/inbox pattern.
--
-- The primary key is the deduplication: a command is claimed with
--   INSERT ... ON CONFLICT (command_id) DO NOTHING RETURNING command_id
-- as the first statement of the transaction that runs the handler. A second delivery of
-- the same command id, even on another instance at the same moment, waits on this unique
-- index until the first transaction ends, then either finds the conflict (the first one
-- committed: re-send the stored reply) or takes the claim itself (it rolled back).
--
-- `outcome` is 'pending' only inside the claiming transaction, which sets the final
-- outcome before it commits; other sessions never see 'pending'. Every answer is stored:
-- 'success' (applied), 'failure' (refused, nothing applied) and 'retryable' (the handler
-- kept failing, nothing applied). A retryable command id is dead for good: the engine
-- retries under a new id and ignores late replies to the old one, so a copy of the old
-- id processed later must get the same 'retryable', never an effect.
--
-- `reply` is the whole reply body ({"outcome", "payload", "error"}), re-sent verbatim to
-- a duplicate. Rows must be kept for longer than any command can be redelivered; prune
-- them with processed_at (indexed for that).
CREATE TABLE saga_processed_commands (
    command_id   text COLLATE "C" PRIMARY KEY CHECK (length(command_id) BETWEEN 1 AND 200),
    saga_id      text NOT NULL,
    command_type text NOT NULL,
    step         text NOT NULL,
    outcome      text NOT NULL CHECK (outcome IN ('pending', 'success', 'failure', 'retryable')),
    reply        jsonb,
    error        text,
    processed_at timestamptz NOT NULL DEFAULT now(),
    CHECK (outcome = 'pending' OR reply IS NOT NULL)
);

CREATE INDEX saga_processed_commands_processed_at_idx ON saga_processed_commands (processed_at);

-- The reply outbox: every reply is written here in the transaction that decided it, and
-- published to Kafka after COMMIT. A process that dies between the COMMIT and the publish
-- leaves the row unpublished; the relay (at start and periodically) publishes it.
--
-- A row holds the Kafka record exactly as it goes out: topic, key, headers (a JSON array
-- of [name, value] pairs, in order) and the JSON body. The relay claims rows with
-- SELECT ... FOR UPDATE SKIP LOCKED, so several instances never publish the same row at
-- the same time. A reply may still be published twice (the relay and a live publisher
-- racing, or a crash after the publish but before published_at is set); the engine
-- deduplicates replies by command id.
CREATE TABLE saga_reply_outbox (
    id           bigserial PRIMARY KEY,
    command_id   text NOT NULL,
    saga_id      text NOT NULL,
    topic        text NOT NULL,
    key          text NOT NULL,
    headers      jsonb NOT NULL,
    body         jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);

-- The relay asks "which rows are still unpublished, oldest first". Almost every row is
-- published within milliseconds, so the partial index stays tiny.
CREATE INDEX saga_reply_outbox_unpublished_idx ON saga_reply_outbox (id)
    WHERE published_at IS NULL;

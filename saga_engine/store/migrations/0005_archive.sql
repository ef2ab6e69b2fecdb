-- 0005_archive: where retention moves finished sagas (SAGA_RETENTION__ARCHIVE=table).
--
-- One row per archived saga: its listing fields and its whole history, as the gzip of
-- the export `saga history ID --json` prints (format saga-engine/history@1), so
-- `saga replay ID` still replays it after the saga left `sagas` and `saga_events`.
-- Rows are written in the transaction that deletes the saga, so a saga is in exactly
-- one of the two places. The key is (saga_id, created_at): once a saga is deleted its
-- id may be started again (an idempotency key reused after the retention period), and
-- that later saga's archive must not replace, nor be refused by, the earlier one's.
CREATE TABLE saga_archive (
    saga_id     text COLLATE "C" NOT NULL,
    saga_type   text COLLATE "C" NOT NULL,
    status      text NOT NULL,
    created_at  timestamptz NOT NULL,
    finished_at timestamptz NOT NULL,
    archived_at timestamptz NOT NULL DEFAULT now(),
    history     bytea NOT NULL,
    PRIMARY KEY (saga_id, created_at)
);

-- "What did we archive last week": archived sagas by their end.
CREATE INDEX saga_archive_finished_at_idx ON saga_archive (finished_at);

-- 0018_blobs: payloads stored by reference (docs/large-payloads.md).
--
-- saga_blobs holds the blobs of the Postgres blob store, by content hash (SHA-256, hex):
-- each is written in the transaction of the event that references it, so a reference
-- never dangles. written_at is touched whenever an event references the blob again, so
-- the sweeper never deletes a blob a transaction is about to reference.
--
-- saga_blob_refs says which saga references which blob, for either store (Postgres or a
-- directory): written with the event, deleted with the saga (retention). The sweeper
-- deletes blobs no saga references that were written more than the grace period ago.
CREATE TABLE saga_blobs (
    digest text PRIMARY KEY,
    data bytea NOT NULL,
    size bigint NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX saga_blobs_written_at ON saga_blobs (written_at);

CREATE TABLE saga_blob_refs (
    saga_id text NOT NULL,
    digest text NOT NULL,
    PRIMARY KEY (saga_id, digest)
);
CREATE INDEX saga_blob_refs_digest ON saga_blob_refs (digest);

-- 0011_domain_events: the domain events sagas wait for (ctx.wait_event, EventSource).
--
-- One row per fact another service published on an EventSource's topic, kept until its
-- source's retention has passed (expires_at), so that a saga that waits for it only
-- later still gets it. The id is the record's ce_id header, else topic/partition/offset:
-- a redelivered record is the same row (the consumer inserts ON CONFLICT DO NOTHING).
-- matched: some saga recorded it; a fact that expires unmatched is counted when
-- housekeeping drops it.
CREATE TABLE saga_domain_events (
    source      text COLLATE "C" NOT NULL,
    event_id    text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    payload     jsonb NOT NULL,
    topic       text NOT NULL DEFAULT '',
    partition   int NOT NULL DEFAULT -1,
    "offset"    bigint NOT NULL DEFAULT -1,
    received_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    matched     boolean NOT NULL DEFAULT false,
    PRIMARY KEY (source, event_id)
);

-- A saga that starts waiting asks for the facts of its source and key, oldest first.
CREATE INDEX saga_domain_events_key_idx ON saga_domain_events (source, key, received_at);
-- Housekeeping drops what expired.
CREATE INDEX saga_domain_events_expires_idx ON saga_domain_events (expires_at);

-- A fact that arrives asks which sagas wait for its source and key: their history says
-- so (event_awaited). Partial, so it holds only those events: the histories of sagas
-- that never wait for a domain event add nothing to it, and their inserts only test
-- the predicate. Building it reads saga_events once, under a lock that holds appends
-- back meanwhile (seconds per million events): run `saga migrate` at a quiet time.
SET LOCAL lock_timeout = '5s';
CREATE INDEX saga_events_event_awaited_idx ON saga_events ((data ->> 'source'), (data ->> 'key'))
    WHERE kind = 'event_awaited';

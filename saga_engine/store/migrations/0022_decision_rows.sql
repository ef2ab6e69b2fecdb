-- 0022_decision_rows: the history as one row per decision instead of one per event.
--
-- Every append the group commit wins writes its events (a start and its first command,
-- a reply and what it issued, the last reply and the end...) as ONE row of
-- saga_decisions: the events as a jsonb array, each sealed by the payload codec on its
-- own as before, their kinds as an array. Sequences stay dense and per event: a row
-- spans seq..last_seq (seq is its first event's), the saga row's last_seq guard is
-- unchanged, and the primary key (saga_id, seq) still refuses a second append at one
-- position. A three-step saga's history was 8 rows and 8 primary-key entries (16 of
-- the ~30 WAL records the store writes for it, bench/store_rows.py); it is now 4 and 4.
--
-- awaits: the domain events the row's event_awaited events wait for, as
-- [{"source": ..., "key": ...}] (null when none): the waits' index below, in place of
-- 0011's expression index over event_awaited rows (an index cannot reach inside the
-- events array). Written by the same insert, from the events, in the same row.
--
-- saga_events stays, as a view of the same columns (one row per event), for operators'
-- SQL and for engines of the release before this one still running while it is
-- deployed: their inserts, updates and deletes through it are turned into rows of
-- saga_decisions by the triggers below (an insert: a one-event row; a delete: the whole
-- decision holding the event).
--
-- The stored histories move here, each saga's events grouped by the transaction that
-- wrote them (recorded_at, the transaction's start) into runs of consecutive sequence
-- numbers: an append's events, or one row per event where that cannot be told. The old
-- table is locked first (ACCESS EXCLUSIVE: its readers and writers wait until this
-- migration commits; seconds per million events), at most 5 s for the lock.
SET LOCAL lock_timeout = '5s';
LOCK TABLE saga_events IN ACCESS EXCLUSIVE MODE;

CREATE TABLE saga_decisions (
    saga_id     text COLLATE "C" NOT NULL,
    seq         int NOT NULL CHECK (seq >= 1),
    last_seq    int NOT NULL,
    kinds       text[] NOT NULL,
    events      jsonb NOT NULL,
    awaits      jsonb,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (saga_id, seq),
    CHECK (cardinality(kinds) = last_seq - seq + 1)
);
-- A decision of a few large events is compressed in its row rather than moved out to
-- the TOAST table (whose heap and index would each add WAL records), unless it still
-- does not fit a page.
ALTER TABLE saga_decisions ALTER COLUMN events SET STORAGE MAIN;

INSERT INTO saga_decisions (saga_id, seq, last_seq, kinds, events, awaits, recorded_at)
SELECT saga_id, min(seq), max(seq), array_agg(kind ORDER BY seq), jsonb_agg(data ORDER BY seq),
       jsonb_agg(jsonb_build_object('source', data ->> 'source', 'key', data ->> 'key')
                 ORDER BY seq) FILTER (WHERE kind = 'event_awaited'),
       recorded_at
FROM (SELECT e.*, e.seq - row_number() OVER (PARTITION BY e.saga_id, e.recorded_at
                                             ORDER BY e.seq) AS run
      FROM saga_events e) AS grouped
GROUP BY saga_id, recorded_at, run;

DROP TABLE saga_events;

-- A saga that continued as new is loaded from its latest run_continued on (0019): the
-- rows holding one, and only those.
CREATE INDEX saga_decisions_runs ON saga_decisions (saga_id, seq)
    WHERE 'run_continued' = ANY (kinds);
-- A fact that arrives asks which sagas wait for its source and key (0011): only the rows
-- that wait enter it.
CREATE INDEX saga_decisions_awaits ON saga_decisions USING gin (awaits jsonb_path_ops)
    WHERE awaits IS NOT NULL;

CREATE VIEW saga_events AS
SELECT d.saga_id, d.seq + e.n::int - 1 AS seq, d.kinds[e.n::int] AS kind, e.data,
       d.recorded_at
FROM saga_decisions AS d
CROSS JOIN LATERAL jsonb_array_elements(d.events) WITH ORDINALITY AS e (data, n);

CREATE FUNCTION saga_events_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO saga_decisions (saga_id, seq, last_seq, kinds, events, awaits, recorded_at)
        VALUES (NEW.saga_id, NEW.seq, NEW.seq, ARRAY[NEW.kind], jsonb_build_array(NEW.data),
                CASE WHEN NEW.kind = 'event_awaited' THEN jsonb_build_array(jsonb_build_object(
                    'source', NEW.data ->> 'source', 'key', NEW.data ->> 'key')) END,
                coalesce(NEW.recorded_at, now()));
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        IF NEW.saga_id IS DISTINCT FROM OLD.saga_id OR NEW.seq IS DISTINCT FROM OLD.seq THEN
            RAISE EXCEPTION 'an event of saga_events keeps its saga_id and seq';
        END IF;
        UPDATE saga_decisions
        SET events = jsonb_set(events, ARRAY[(OLD.seq - seq)::text], NEW.data),
            kinds[OLD.seq - seq + 1] = NEW.kind
        WHERE saga_id = OLD.saga_id AND seq <= OLD.seq AND last_seq >= OLD.seq;
        UPDATE saga_decisions
        SET awaits = (SELECT jsonb_agg(jsonb_build_object('source', e.data ->> 'source',
                                                          'key', e.data ->> 'key') ORDER BY e.n)
                      FROM jsonb_array_elements(events) WITH ORDINALITY AS e (data, n)
                      WHERE kinds[e.n::int] = 'event_awaited')
        WHERE saga_id = OLD.saga_id AND seq <= OLD.seq AND last_seq >= OLD.seq;
        RETURN NEW;
    END IF;
    DELETE FROM saga_decisions
    WHERE saga_id = OLD.saga_id AND seq <= OLD.seq AND last_seq >= OLD.seq;
    RETURN OLD;
END
$$;

CREATE TRIGGER saga_events_write INSTEAD OF INSERT OR UPDATE OR DELETE ON saga_events
    FOR EACH ROW EXECUTE FUNCTION saga_events_write();

-- 0019_runs: a saga's runs (ctx.continue_as_new; docs/continue-as-new.md).
--
-- A saga that continued as new is loaded from its saga_started (seq 1) and its latest
-- run_continued event on: the current run, never the runs before. This partial index
-- holds only run_continued events, so finding the latest is one probe of a small index
-- whatever the history's length, and an insert of any other event adds no index entry.
CREATE INDEX saga_events_runs ON saga_events (saga_id, seq) WHERE kind = 'run_continued';

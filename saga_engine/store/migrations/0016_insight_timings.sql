-- 0016_insight_timings: where a step's time goes, and what it costs (saga_insights, 0014).
--
-- Replies now carry timing headers (PROTOCOL.md 7.4a), recorded on their reply_received
-- events. The roll-up adds them to saga_insights as rows of a new facet, 'phase' (key:
-- the node, detail: held, to_participant, waiting, handler, commit, back, apply or cpu;
-- runs: the observations; hist: their histogram), with their sum in microseconds here:
-- the histogram's bounds give percentiles, a learned cost needs the mean. Every other
-- row keeps 0. A column with a constant default: no rewrite of the table.
ALTER TABLE saga_insights ADD COLUMN total_us bigint NOT NULL DEFAULT 0;

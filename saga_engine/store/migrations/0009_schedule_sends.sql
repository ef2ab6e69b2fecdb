-- 0009_schedule_sends: the ticks a schedule claim is sending (saga_engine/_pgschedules.py).
--
-- A claim holds its saga_schedules rows locked from its SELECT to its commit, and only
-- that commit records what it fired. Just before sending a tick's start, it records the
-- tick here, committed on its own (the locked row cannot be written outside the claim).
-- A claim that dies after the send leaves the row as it was and its ticks here: the next
-- claim of the schedule sends them again (the engine deduplicates a start by its saga
-- id, derived from the tick), counts them as fired, and takes the newest one's saga for
-- the one that overlap=skip waits on. The claim that commits deletes its schedule's rows.
--
-- No foreign key to saga_schedules: checking one would lock the schedule's row FOR KEY
-- SHARE, which waits for the claim that holds it FOR UPDATE, and that claim is the
-- writer here.
CREATE TABLE saga_schedule_sends (
    schedule_id text COLLATE "C" NOT NULL,
    tick        timestamptz NOT NULL,
    PRIMARY KEY (schedule_id, tick)
);

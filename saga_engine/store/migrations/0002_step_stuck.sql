-- 0002_step_stuck: a saga may park as step_stuck.
--
-- A forward step whose success reply does not match the step's reply model (or holds a
-- value Postgres cannot store) is held for an operator, and the saga's status is
-- 'step_stuck' until one retries or skips the step, or cancels the saga.
--
-- The status check is replaced by a wider one. NOT VALID: the existing rows are not
-- scanned again (every one of them passed the old, narrower check, so each passes this
-- one), which keeps the ACCESS EXCLUSIVE lock ALTER TABLE takes to an instant even on a
-- table of millions of sagas; rows written from now on are checked as usual.
ALTER TABLE sagas DROP CONSTRAINT sagas_status_check;
ALTER TABLE sagas ADD CONSTRAINT sagas_status_check
    CHECK (status IN (
        'running', 'compensating', 'completed', 'compensated',
        'failed', 'cancelled', 'compensation_stuck', 'nondeterministic', 'step_stuck'
    )) NOT VALID;

-- 0007_schedules: durable schedules (saga_engine/_schedule.py, _scheduler.py).
--
-- One row per schedule. A schedule starts `saga_type` with `input` at each tick of
-- `spec` (a cron expression in a time zone, or a fixed interval: ScheduleSpec's JSON).
-- `next_fire_at` is the first tick not yet handled: the scheduler claims the rows
-- whose next_fire_at has passed, sends each chosen tick's start request, and only once
-- Kafka has acknowledged those moves next_fire_at past now, in the claim's transaction.
-- A deleted schedule's row is deleted (the sagas it started keep their own history).
CREATE TABLE saga_schedules (
    schedule_id   text COLLATE "C" PRIMARY KEY
                  CHECK (length(schedule_id) BETWEEN 1 AND 120),
    saga_type     text COLLATE "C" NOT NULL,
    spec          jsonb NOT NULL,
    input         jsonb NOT NULL,
    catchup       text NOT NULL CHECK (catchup IN ('skip', 'last', 'all')),
    catchup_max   int NOT NULL CHECK (catchup_max BETWEEN 1 AND 1000),
    overlap       text NOT NULL CHECK (overlap IN ('skip', 'allow')),
    state         text NOT NULL CHECK (state IN ('active', 'paused')),
    -- 'code': declared in a worker's code (upserted at its start); 'api': created by an
    -- operator. A worker's upsert never touches an 'api' schedule of the same id.
    origin        text NOT NULL CHECK (origin IN ('code', 'api')),
    -- The whole declaration as given (Schedule's JSON): an upsert with the same one
    -- changes nothing.
    definition    jsonb NOT NULL,
    next_fire_at  timestamptz NOT NULL,
    last_fired_at timestamptz,
    last_tick     timestamptz,
    last_saga_id  text,
    fired_count   bigint NOT NULL DEFAULT 0,
    skipped_count bigint NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL,
    updated_at    timestamptz NOT NULL
);

-- The due scan: "active schedules whose next_fire_at <= now, oldest first", and the
-- idle poll "the earliest next_fire_at". A paused schedule is not in the index, so
-- pausing thousands costs the scan nothing.
CREATE INDEX saga_schedules_due_idx ON saga_schedules (next_fire_at) WHERE state = 'active';

-- The schedule of every process whose latest version declares one: when it
-- is due next, and its last run. A run and the move to the next due time are
-- one transaction, conditional on the due time it fired for, so that with
-- several execution replicas a due time fires once.
CREATE TABLE schedules (
    process_name TEXT PRIMARY KEY,
    cron TEXT NOT NULL,
    time_zone TEXT NOT NULL,
    missed TEXT NOT NULL,
    next_fire_at BIGINT NOT NULL,
    last_fired_at BIGINT,
    last_execution_id TEXT NOT NULL
);
CREATE INDEX schedules_by_due_time ON schedules (next_fire_at);

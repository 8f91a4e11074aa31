-- Subtasks asked of a session's lead (RequestSubtask) and the lead's
-- decisions (DecideSubtask); at most 100 per session.
CREATE TABLE session_subtasks (
    execution_id TEXT NOT NULL REFERENCES executions (id),
    id TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    role TEXT NOT NULL,
    subtask TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL,
    decided_by TEXT NOT NULL DEFAULT '',
    note TEXT NOT NULL DEFAULT '',
    requested_at BIGINT NOT NULL,
    decided_at BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (execution_id, id)
);

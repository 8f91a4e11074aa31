-- Team sessions: an execution may run as one, with a task (title and
-- description) and the role and subtask of each participant.
ALTER TABLE executions ADD COLUMN is_session INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN session_title TEXT NOT NULL DEFAULT '';
ALTER TABLE executions ADD COLUMN session_description TEXT NOT NULL DEFAULT '';

CREATE TABLE session_assignments (
    execution_id TEXT NOT NULL REFERENCES executions (id),
    agent_id TEXT NOT NULL,
    role TEXT NOT NULL,
    subtask TEXT NOT NULL DEFAULT '',
    assigned_by TEXT NOT NULL,
    assigned_at INTEGER NOT NULL,
    PRIMARY KEY (execution_id, agent_id)
);

-- The permission matrix, versioned; the newest version is in force.
CREATE TABLE permission_matrices (
    version INTEGER PRIMARY KEY,
    source TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    created_by TEXT NOT NULL
);

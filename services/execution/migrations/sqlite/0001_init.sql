CREATE TABLE processes (
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    source TEXT NOT NULL,
    published_at INTEGER NOT NULL,
    step_count INTEGER NOT NULL,
    warnings BLOB NOT NULL,
    PRIMARY KEY (name, version)
);

CREATE TABLE executions (
    id TEXT PRIMARY KEY,
    process_name TEXT NOT NULL,
    process_version INTEGER NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    lead_agent_id TEXT NOT NULL DEFAULT '',
    inputs_json TEXT NOT NULL,
    idempotency_key TEXT UNIQUE,
    started_at INTEGER NOT NULL,
    ended_at INTEGER,
    last_sequence INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX executions_by_status ON executions (status);

CREATE TABLE steps (
    execution_id TEXT NOT NULL REFERENCES executions (id),
    step_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    status TEXT NOT NULL,
    executor TEXT NOT NULL DEFAULT '',
    attempt INTEGER NOT NULL DEFAULT 0,
    output_json TEXT NOT NULL DEFAULT '',
    error_code TEXT NOT NULL DEFAULT '',
    error_message TEXT NOT NULL DEFAULT '',
    started_at INTEGER,
    ended_at INTEGER,
    cost REAL NOT NULL DEFAULT 0,
    tokens_used INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (execution_id, step_id)
);

CREATE TABLE events (
    execution_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    event BLOB NOT NULL,
    PRIMARY KEY (execution_id, sequence)
);

-- AUTOINCREMENT: ids must never be reused, or the publisher (which reads
-- after the last id it sent) would skip events written after the table emptied.
CREATE TABLE outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL,
    event BLOB NOT NULL
);

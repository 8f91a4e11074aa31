CREATE TABLE processes (
    name TEXT NOT NULL,
    version BIGINT NOT NULL,
    source TEXT NOT NULL,
    published_at BIGINT NOT NULL,
    step_count BIGINT NOT NULL,
    warnings BYTEA NOT NULL,
    PRIMARY KEY (name, version)
);

CREATE TABLE executions (
    id TEXT PRIMARY KEY,
    process_name TEXT NOT NULL,
    process_version BIGINT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    lead_agent_id TEXT NOT NULL DEFAULT '',
    inputs_json TEXT NOT NULL,
    idempotency_key TEXT UNIQUE,
    started_at BIGINT NOT NULL,
    ended_at BIGINT,
    last_sequence BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX executions_by_status ON executions (status);

CREATE TABLE steps (
    execution_id TEXT NOT NULL REFERENCES executions (id),
    step_id TEXT NOT NULL,
    position BIGINT NOT NULL,
    status TEXT NOT NULL,
    executor TEXT NOT NULL DEFAULT '',
    attempt BIGINT NOT NULL DEFAULT 0,
    output_json TEXT NOT NULL DEFAULT '',
    error_code TEXT NOT NULL DEFAULT '',
    error_message TEXT NOT NULL DEFAULT '',
    started_at BIGINT,
    ended_at BIGINT,
    cost DOUBLE PRECISION NOT NULL DEFAULT 0,
    tokens_used BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (execution_id, step_id)
);

CREATE TABLE events (
    execution_id TEXT NOT NULL,
    sequence BIGINT NOT NULL,
    event BYTEA NOT NULL,
    PRIMARY KEY (execution_id, sequence)
);

CREATE TABLE outbox (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id TEXT NOT NULL,
    event BYTEA NOT NULL
);

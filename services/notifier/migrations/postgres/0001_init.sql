-- Every event the notifier has accepted, once: the deduplication table and the
-- one copy of the event its notifications point to.
CREATE TABLE events (
    event_id TEXT PRIMARY KEY,
    event BYTEA NOT NULL,           -- the encoded muster.common.v1.StepEvent
    output_summary TEXT NOT NULL,   -- as in the NDJSON memory
    notifications BIGINT NOT NULL, -- how many were created
    received_at BIGINT NOT NULL    -- ms since the epoch
);

-- One row per recipient agent of an event; the id is the agent's cursor.
CREATE TABLE notifications (
    notification_id BIGINT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    reason BIGINT NOT NULL,        -- 1 informed, 2 monitor, 3 lead
    event_id TEXT NOT NULL REFERENCES events (event_id),
    memory_state BIGINT NOT NULL   -- 0 pending, 1 written, 2 refused, 3 disabled, 4 failed
);
CREATE INDEX notifications_by_agent ON notifications (agent_id, notification_id);
CREATE INDEX notifications_memory_failed ON notifications (notification_id) WHERE memory_state = 4;

-- How far each agent has read.
CREATE TABLE acknowledgements (
    agent_id TEXT PRIMARY KEY,
    acknowledged_cursor BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

-- NDJSON exactly-once bookkeeping: every notification up to written_through
-- has its line (unless failed), and each memory file's length before the
-- latest append.
CREATE TABLE memory_progress (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    written_through BIGINT NOT NULL
);
INSERT INTO memory_progress (singleton, written_through) VALUES (1, 0);

CREATE TABLE memory_files (
    path TEXT PRIMARY KEY,
    length_before_append BIGINT NOT NULL
);

-- A published version keeps its definition as checked at publish (the
-- process model as JSON), so nothing parses the YAML again, and the hash of
-- its source, so publishing the same source again returns that version.
ALTER TABLE processes ADD COLUMN definition TEXT;
ALTER TABLE processes ADD COLUMN content_hash TEXT NOT NULL DEFAULT '';

-- What the engine kept only in memory: the agent a step was reassigned or
-- handed to, the agents it passed through, a queued step's estimated wait,
-- when a failed attempt's retry may start, and whether the roster holds a
-- slot for the step.
ALTER TABLE steps ADD COLUMN assigned_to TEXT;
ALTER TABLE steps ADD COLUMN delegation_chain TEXT NOT NULL DEFAULT '[]';
ALTER TABLE steps ADD COLUMN wait_seconds INTEGER NOT NULL DEFAULT 0;
ALTER TABLE steps ADD COLUMN retry_at INTEGER;
ALTER TABLE steps ADD COLUMN roster_reserved INTEGER NOT NULL DEFAULT 0;

-- One log of events, numbered in the order they were committed, replaces
-- the events table and the outbox: the notifier is sent the log from its
-- cursor on, and the cursor moves as the notifier acknowledges.
CREATE TABLE event_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    execution_id TEXT NOT NULL,
    sequence INTEGER NOT NULL,
    event BLOB NOT NULL
);
-- Events the notifier acknowledged come first, then the outbox's, in its order.
INSERT INTO event_log (execution_id, sequence, event)
    SELECT e.execution_id, e.sequence, e.event FROM events e
    WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.event = e.event)
    ORDER BY e.execution_id, e.sequence;
CREATE TABLE event_cursors (
    name TEXT PRIMARY KEY,
    position INTEGER NOT NULL
);
INSERT INTO event_cursors (name, position) SELECT 'notifier', COALESCE(MAX(id), 0) FROM event_log;
INSERT INTO event_log (execution_id, sequence, event)
    SELECT e.execution_id, e.sequence, e.event FROM outbox o JOIN events e ON e.event = o.event ORDER BY o.id;
DROP TABLE outbox;
DROP TABLE events;
ALTER TABLE event_log RENAME TO events;
CREATE UNIQUE INDEX events_by_execution ON events (execution_id, sequence);

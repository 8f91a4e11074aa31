-- Inboxes: messages that start the runs of the process an inbox triggers.
ALTER TABLE processes ADD COLUMN trigger_inbox TEXT NOT NULL DEFAULT '';
CREATE INDEX processes_by_trigger_inbox ON processes (trigger_inbox);

CREATE TABLE inbox_messages (
    id TEXT PRIMARY KEY,
    inbox TEXT NOT NULL,
    sender TEXT NOT NULL,
    priority TEXT NOT NULL,
    subject TEXT NOT NULL,
    body TEXT NOT NULL,
    posted_at INTEGER NOT NULL,
    state TEXT NOT NULL,
    -- The run that has the message now ('' when none).
    claimed_by TEXT NOT NULL DEFAULT '',
    processed_by TEXT NOT NULL DEFAULT '',
    -- Why the message is still unprocessed after a run had it.
    note TEXT NOT NULL DEFAULT ''
);
CREATE INDEX inbox_messages_by_inbox ON inbox_messages (inbox, posted_at, id);
CREATE INDEX inbox_messages_by_claim ON inbox_messages (claimed_by);

-- The audit trail's newest records. A decision appends its record here, in
-- its own transaction: one row at the end of a table without indexes, where
-- `delegations` takes a row and five index entries. The roster moves the
-- records into `delegations` in batches, in the background and before every
-- read of the trail, each batch in one transaction.
CREATE TABLE delegation_log (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    requester_id TEXT NOT NULL,
    primary_agent_id TEXT NOT NULL,
    decision TEXT NOT NULL,
    tier TEXT NOT NULL,
    decision_json TEXT NOT NULL,
    description TEXT NOT NULL,
    decided_at INTEGER NOT NULL
);

-- A reservation is found by its task alone: stored in the order of its key,
-- a reservation is one B-tree entry where a table with row ids keeps two
-- (the row and its key's index), and no index by agent (nothing looks a
-- reservation up by its agent), so each commit writes two pages less.
CREATE TABLE reservations_by_task (
    task_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    reserved_at INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO reservations_by_task (task_id, agent_id, reserved_at)
    SELECT task_id, agent_id, reserved_at FROM reservations;
DROP TABLE reservations;
ALTER TABLE reservations_by_task RENAME TO reservations;

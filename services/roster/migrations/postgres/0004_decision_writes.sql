-- The audit trail's newest records. A decision appends its record here, in
-- its own transaction: one row at the end of a table indexed by its order
-- alone, where `delegations` takes a row and five index entries. The roster
-- moves the records into `delegations` in batches, in the background and
-- before every read of the trail, each batch in one transaction.
CREATE TABLE delegation_log (
    seq BIGSERIAL PRIMARY KEY,
    id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    requester_id TEXT NOT NULL,
    primary_agent_id TEXT NOT NULL,
    decision TEXT NOT NULL,
    tier TEXT NOT NULL,
    decision_json TEXT NOT NULL,
    description TEXT NOT NULL,
    decided_at BIGINT NOT NULL
);

-- Nothing looks a reservation up by its agent: one index less to write on
-- every decision and release.
DROP INDEX reservations_agent;

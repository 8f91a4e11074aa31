-- A running execution's progress (the rows of executions that go on, the
-- steps' rows, the events) written by one call: the driver's commits on
-- PostgreSQL. A function's statements are planned once per connection,
-- where the same statements sent as text were planned on every commit
-- (about a third of a small commit's time). Called alone, it is its own
-- transaction: it holds the lease first (`muster_hold_lease`), so the event
-- log's turn is held before the events draw their positions, and an error
-- in any statement rolls back all.
CREATE FUNCTION muster_commit_progress(lease_holder TEXT, execution_rows JSON, step_rows JSON, event_rows JSON)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF lease_holder IS NOT NULL THEN
        PERFORM muster_hold_lease(lease_holder);
    END IF;
    UPDATE executions AS e SET status = r.status, reason = r.reason, lead_agent_id = r.lead_agent_id,
        ended_at = r.ended_at, last_sequence = r.last_sequence
        FROM json_to_recordset(execution_rows) AS r(id TEXT, status TEXT, reason TEXT, lead_agent_id TEXT,
            ended_at BIGINT, last_sequence BIGINT)
        WHERE e.id = r.id;
    INSERT INTO steps (execution_id, step_id, position, status, executor, attempt, output_json, error_code,
        error_message, started_at, ended_at, cost, tokens_used, assigned_to, delegation_chain, wait_seconds,
        retry_at, roster_reserved, slot_task)
        SELECT r.execution_id, r.step_id, r.position, r.status, r.executor, r.attempt, r.output_json, r.error_code,
            r.error_message, r.started_at, r.ended_at, r.cost, r.tokens_used, r.assigned_to, r.delegation_chain,
            r.wait_seconds, r.retry_at, r.roster_reserved, r.slot_task
        FROM json_to_recordset(step_rows) AS r(execution_id TEXT, step_id TEXT, position BIGINT, status TEXT,
            executor TEXT, attempt BIGINT, output_json TEXT, error_code TEXT, error_message TEXT, started_at BIGINT,
            ended_at BIGINT, cost DOUBLE PRECISION, tokens_used BIGINT, assigned_to TEXT, delegation_chain TEXT,
            wait_seconds BIGINT, retry_at BIGINT, roster_reserved BIGINT, slot_task TEXT)
        ON CONFLICT (execution_id, step_id) DO UPDATE SET status = excluded.status,
            executor = excluded.executor, attempt = excluded.attempt, output_json = excluded.output_json,
            error_code = excluded.error_code, error_message = excluded.error_message,
            started_at = excluded.started_at, ended_at = excluded.ended_at, cost = excluded.cost,
            tokens_used = excluded.tokens_used, assigned_to = excluded.assigned_to,
            delegation_chain = excluded.delegation_chain, wait_seconds = excluded.wait_seconds,
            retry_at = excluded.retry_at, roster_reserved = excluded.roster_reserved,
            slot_task = excluded.slot_task;
    INSERT INTO events (execution_id, sequence, event)
        SELECT r.execution_id, r.sequence, decode(r.event, 'hex')
        FROM json_to_recordset(event_rows) AS r(execution_id TEXT, sequence BIGINT, event TEXT);
END
$$;

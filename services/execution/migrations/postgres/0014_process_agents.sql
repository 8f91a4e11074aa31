-- The executions an agent takes part in, listed in SQL (ListExecutions for
-- an agent): its lead (executions.lead_agent_id), a participant of its
-- session (session_assignments), the executor of a step (steps.executor),
-- or named in a step of its process version: those agents, kept per
-- version when it is published (a version never changes). The versions
-- published before are listed when the service starts (agents_listed = 0).
CREATE TABLE process_agents (
    agent_id TEXT NOT NULL,
    process_name TEXT NOT NULL,
    process_version BIGINT NOT NULL,
    PRIMARY KEY (agent_id, process_name, process_version)
);
ALTER TABLE processes ADD COLUMN agents_listed BIGINT NOT NULL DEFAULT 0;
CREATE INDEX executions_by_lead ON executions (lead_agent_id);
CREATE INDEX session_assignments_by_agent ON session_assignments (agent_id);

-- The roster: teams, agents (with their expertise and hashed token), role
-- definitions, workload reservations, the delegation queue and the audit trail.
-- Times are milliseconds since the Unix epoch.

CREATE TABLE teams (
    name TEXT PRIMARY KEY,
    description TEXT NOT NULL DEFAULT '',
    lead_agent_id TEXT NOT NULL DEFAULT '',
    updated_at INTEGER NOT NULL
);

CREATE TABLE agents (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    role TEXT NOT NULL DEFAULT '',
    team TEXT NOT NULL DEFAULT '',
    senior_id TEXT NOT NULL DEFAULT '',
    expertise_json TEXT NOT NULL DEFAULT '[]',
    manual_status TEXT NOT NULL DEFAULT '',
    current_workload INTEGER NOT NULL DEFAULT 0 CHECK (current_workload >= 0),
    workload_capacity INTEGER NOT NULL DEFAULT 5,
    availability_until INTEGER,
    custom_prompt TEXT NOT NULL DEFAULT '',
    llm_config_json TEXT NOT NULL DEFAULT '',
    backstory TEXT NOT NULL DEFAULT '',
    allow_delegation INTEGER NOT NULL DEFAULT 0,
    max_iterations INTEGER NOT NULL DEFAULT 10,
    token_hash TEXT UNIQUE,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX agents_team ON agents (team);
CREATE INDEX agents_role ON agents (role);
CREATE INDEX agents_senior ON agents (senior_id);

CREATE TABLE agent_expertise (
    tag TEXT NOT NULL,
    agent_id TEXT NOT NULL REFERENCES agents (id) ON DELETE CASCADE,
    PRIMARY KEY (tag, agent_id)
);
CREATE INDEX agent_expertise_agent ON agent_expertise (agent_id);

CREATE TABLE roles (
    name TEXT PRIMARY KEY,
    definition_json TEXT NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE reservations (
    task_id TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    reserved_at INTEGER NOT NULL
);
CREATE INDEX reservations_agent ON reservations (agent_id);

CREATE TABLE queued_tasks (
    seq INTEGER PRIMARY KEY,
    task_id TEXT NOT NULL UNIQUE,
    expert_id TEXT NOT NULL,
    requester_id TEXT NOT NULL,
    escalate_to TEXT NOT NULL,
    request_json TEXT NOT NULL,
    queued_at INTEGER NOT NULL,
    expires_at INTEGER,
    state TEXT NOT NULL,
    resolution_json TEXT
);
CREATE INDEX queued_tasks_expert ON queued_tasks (expert_id, state, queued_at);
CREATE INDEX queued_tasks_state ON queued_tasks (state, expires_at);

CREATE TABLE delegations (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    task_id TEXT NOT NULL,
    requester_id TEXT NOT NULL,
    primary_agent_id TEXT NOT NULL,
    decision TEXT NOT NULL,
    tier TEXT NOT NULL,
    decision_json TEXT NOT NULL,
    description TEXT NOT NULL,
    decided_at INTEGER NOT NULL
);
CREATE INDEX delegations_task ON delegations (task_id);
CREATE INDEX delegations_requester ON delegations (requester_id, decided_at);
CREATE INDEX delegations_primary ON delegations (primary_agent_id, decided_at);
CREATE INDEX delegations_time ON delegations (decided_at);

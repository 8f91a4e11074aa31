-- Agent credentials with their history, so every service can follow them:
-- each token (its SHA-256, hex), its agent and role, whether it is still
-- good, and the revision of its last change. Revisions come from one counter
-- row that every credential change updates first: writers queue on its lock,
-- so revisions become visible in order and a reader that remembers the last
-- one it saw never skips a change.
CREATE TABLE credential_revision (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    revision BIGINT NOT NULL
);
INSERT INTO credential_revision (id, revision) VALUES (1, 1);

CREATE TABLE tokens (
    token_hash TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    role TEXT NOT NULL DEFAULT '',
    active BIGINT NOT NULL,
    revision BIGINT NOT NULL,
    issued_at BIGINT NOT NULL,
    revoked_at BIGINT
);
CREATE INDEX tokens_agent ON tokens (agent_id, active);
CREATE INDEX tokens_revision ON tokens (revision, token_hash);

-- The tokens issued before: revision 1. `agents.token_hash` is no longer used.
INSERT INTO tokens (token_hash, agent_id, role, active, revision, issued_at)
    SELECT token_hash, id, role, 1, 1, updated_at FROM agents WHERE token_hash IS NOT NULL;
UPDATE agents SET token_hash = NULL;

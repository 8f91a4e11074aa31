-- Every change of an agent's row raises its version by one, so the roster's
-- in-memory index can tell a newer row from an older one; `updated_at` finds
-- the rows changed lately, which replicas sharing the database read again.
ALTER TABLE agents ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
CREATE INDEX agents_updated_at ON agents (updated_at);
CREATE INDEX teams_updated_at ON teams (updated_at);

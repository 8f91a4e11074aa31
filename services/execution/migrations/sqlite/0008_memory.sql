-- What runs remember: the global memory (role '') and each role's. Workers
-- add entries with a step's completion; operators add and remove them.
CREATE TABLE memory (
    id TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    text TEXT NOT NULL,
    author TEXT NOT NULL,
    execution_id TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX memory_by_role ON memory (role, created_at, id);

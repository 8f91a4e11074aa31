-- A version per memory (role '' is the global memory), raised with every
-- entry added to it or removed from it: a running execution reads an
-- agent's memory again only when the version moved since it last did.
CREATE TABLE memory_versions (
    role TEXT PRIMARY KEY,
    version BIGINT NOT NULL
);

-- The execution service's replicas on this database. A replica holds a
-- lease (until expires_at, in milliseconds since the epoch, by the
-- database's clock) on the executions it drives; it renews it while it
-- lives, and every commit of its drivers checks it first. The others reach
-- it at url (empty: they cannot) with calls about the executions it drives.
CREATE TABLE replicas (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    joined_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);

-- The replica that drives an unfinished execution. NULL, or a replica no
-- longer in `replicas`: nobody does, and the next replica to look takes it
-- over. Not indexed: it is looked up among the unfinished executions (by
-- status), and an index would be one more entry to write on every update
-- of an execution's row.
ALTER TABLE executions ADD COLUMN owner TEXT;

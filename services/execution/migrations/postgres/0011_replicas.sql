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

-- The first thing every transaction of a replica's drivers does, sent with
-- its BEGIN (one round trip): it takes the event log's turn, an advisory
-- lock held until the transaction ends (replicas append to the log one
-- transaction at a time, so positions follow commit order, and a takeover
-- takes the same turn), then finds the replica's lease unexpired, by the
-- database's clock. A lapsed lease makes the transaction read-only: its
-- first write fails (SQLSTATE 25006) and nothing is written. (Raising an
-- error here would fail the BEGIN it is sent with and leave the connection
-- inside the failed transaction.)
CREATE FUNCTION muster_hold_lease(replica TEXT) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1836413812, 7106407);
    -- A statement of its own: it reads what committed before the turn came.
    PERFORM 1 FROM replicas
        WHERE id = replica AND expires_at > (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT;
    IF NOT FOUND THEN
        PERFORM set_config('transaction_read_only', 'on', true);
    END IF;
END
$$;

-- A step that follows a step of the same named executor takes over that
-- step's roster slot (its task id here) instead of asking the roster again.
ALTER TABLE steps ADD COLUMN slot_task TEXT NOT NULL DEFAULT '';

-- A completed step's output, appended once, in the order written: the step
-- row names it (`output_id`) and keeps `output_json` empty. A row that
-- grows from a few dozen bytes to a whole output split its page, and its
-- neighbours', on every completion; appended, an output takes the next
-- free bytes of the table's last page. A step whose output is written
-- apart from its completion (an operator's) keeps it in `output_json`,
-- which, when not empty, is the output.
CREATE TABLE step_outputs (
    id INTEGER PRIMARY KEY,
    output TEXT NOT NULL
);
ALTER TABLE steps ADD COLUMN output_id INTEGER;

-- The W3C traceparent of the span that started the execution: its steps,
-- in every service, join that trace, also after a restart.
ALTER TABLE executions ADD COLUMN trace_parent TEXT NOT NULL DEFAULT '';

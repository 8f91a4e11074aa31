-- Budgets operators set on processes (SetBudget); they replace the budget a
-- process's definition declares.
CREATE TABLE budgets (
    process_name TEXT PRIMARY KEY,
    period_seconds BIGINT NOT NULL,
    max_cost DOUBLE PRECISION NOT NULL,
    max_tokens BIGINT NOT NULL,
    max_runs BIGINT NOT NULL,
    run_max_cost DOUBLE PRECISION NOT NULL,
    run_max_tokens BIGINT NOT NULL,
    -- stop, pause or warn: what happens to a run that goes over a limit.
    on_exceed TEXT NOT NULL,
    set_at BIGINT NOT NULL,
    set_by TEXT NOT NULL
);

-- Budgets and throttles read a process's executions by their start.
CREATE INDEX executions_by_process ON executions (process_name, started_at);

-- Budgets operators set on processes (SetBudget); they replace the budget a
-- process's definition declares.
CREATE TABLE budgets (
    process_name TEXT PRIMARY KEY,
    period_seconds INTEGER NOT NULL,
    max_cost REAL NOT NULL,
    max_tokens INTEGER NOT NULL,
    max_runs INTEGER NOT NULL,
    run_max_cost REAL NOT NULL,
    run_max_tokens INTEGER NOT NULL,
    -- stop, pause or warn: what happens to a run that goes over a limit.
    on_exceed TEXT NOT NULL,
    set_at INTEGER NOT NULL,
    set_by TEXT NOT NULL
);

-- Budgets and throttles read a process's executions by their start.
CREATE INDEX executions_by_process ON executions (process_name, started_at);

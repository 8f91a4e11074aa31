-- Budgets operators set on processes (SetBudget); they replace the budget a
-- process's definition declares.
CREATE TABLE budgets (
    process_name TEXT PRIMARY KEY,
    period_seconds BIGINT NOT NULL,
    max_cost DOUBLE PRECISION NOT NULL,
    max_tokens BIGINT NOT NULL,
    max_runs BIGINT NOT NULL,
    set_at BIGINT NOT NULL,
    set_by TEXT NOT NULL
);

-- Agents' budgets live in `budgets` under the key 'agent:<id>' (process names
-- have no ':'); their use is read from the steps each agent started.
CREATE INDEX steps_by_executor ON steps (executor, started_at);

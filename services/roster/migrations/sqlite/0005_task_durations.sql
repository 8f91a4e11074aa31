-- How long an agent's tasks take, observed: a moving average of the time
-- from a slot's reservation to its release, in ms (0 until one ended). The
-- estimated wait for a busy agent's slot comes from it.
ALTER TABLE agents ADD COLUMN average_task_millis BIGINT NOT NULL DEFAULT 0;

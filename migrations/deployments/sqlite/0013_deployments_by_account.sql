-- A history entry takes its deployment's account, as on PostgreSQL (see the
-- twin of this migration): the statements that write and read the history
-- name it. SQLite's keys stay as they are: a single file is never sharded.

ALTER TABLE deployment_history ADD COLUMN account_id TEXT;
UPDATE deployment_history
SET account_id = (SELECT d.account_id FROM deployments d WHERE d.id = deployment_history.deployment_id);
DROP INDEX deployment_history_by_deployment;
CREATE INDEX deployment_history_by_deployment ON deployment_history (account_id, deployment_id, seq);

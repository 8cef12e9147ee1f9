-- The shape a distributed PostgreSQL shards (docs/design.md §13): every key of
-- the deployments' tables begins with account_id, and a history entry or an
-- environment finds its deployment within its account, so the three tables
-- can live on the node of their account. A history entry takes its
-- deployment's account (the SQLite twin adds the same column). Upgrades in
-- place: every row stays.

ALTER TABLE deployment_history DROP CONSTRAINT deployment_history_deployment_id_fkey;
ALTER TABLE environments DROP CONSTRAINT environments_current_deployment_id_fkey;

ALTER TABLE deployments DROP CONSTRAINT deployments_pkey;
ALTER TABLE deployments ADD PRIMARY KEY (account_id, seq);
ALTER TABLE deployments DROP CONSTRAINT deployments_id_key;
ALTER TABLE deployments ADD CONSTRAINT deployments_id_key UNIQUE (account_id, id);
ALTER TABLE deployments DROP CONSTRAINT deployments_operation_id_key;
ALTER TABLE deployments ADD CONSTRAINT deployments_operation_id_key UNIQUE (account_id, operation_id);

ALTER TABLE deployment_history ADD COLUMN account_id TEXT;
UPDATE deployment_history h SET account_id = d.account_id FROM deployments d WHERE d.id = h.deployment_id;
ALTER TABLE deployment_history ALTER COLUMN account_id SET NOT NULL;
ALTER TABLE deployment_history DROP CONSTRAINT deployment_history_pkey;
ALTER TABLE deployment_history ADD PRIMARY KEY (account_id, seq);
ALTER TABLE deployment_history ADD CONSTRAINT deployment_history_deployment_id_fkey
    FOREIGN KEY (account_id, deployment_id) REFERENCES deployments (account_id, id);
DROP INDEX deployment_history_by_deployment;
CREATE INDEX deployment_history_by_deployment ON deployment_history (account_id, deployment_id, seq);

ALTER TABLE environments ADD CONSTRAINT environments_current_deployment_id_fkey
    FOREIGN KEY (account_id, current_deployment_id) REFERENCES deployments (account_id, id);

-- Deployments and rollbacks (docs/contract.md §7 Deployments): immutable releases
-- rolled out by the deployment controller, by way of the outbox.
-- Times are fixed-width RFC 3339 UTC text (platform::time::Timestamp).

-- A deployment or a rollback: both take the environment's lock and are rolled
-- out the same way; a rollback says what it replaces and what it restores.
CREATE TABLE deployments (
    seq                        INTEGER PRIMARY KEY AUTOINCREMENT,
    -- its place in the account's lists, given in commit order when a list is read
    list_seq                   INTEGER,
    -- dep_… for a deployment, rb_… for a rollback
    id                         TEXT    NOT NULL UNIQUE,
    account_id                 TEXT    NOT NULL,
    kind                       TEXT    NOT NULL CHECK (kind IN ('deployment', 'rollback')),
    service                    TEXT    NOT NULL,
    environment                TEXT    NOT NULL,
    -- immutable references only: what was approved is what runs
    artifact_digest            TEXT    NOT NULL CHECK (length(artifact_digest) = 71
                                   AND artifact_digest GLOB 'sha256:*' AND substr(artifact_digest, 8) NOT GLOB '*[^0-9a-f]*'),
    commit_sha                 TEXT    CHECK (length(commit_sha) = 40 AND commit_sha NOT GLOB '*[^0-9a-f]*'),
    state                      TEXT    NOT NULL CHECK (state IN
                                   ('queued', 'running', 'succeeded', 'failed', 'cancelled', 'unknown')),
    -- the environment's current release when this one was asked for
    replaces                   TEXT,
    -- a rollback's target: a release that succeeded in this environment
    restores                   TEXT,
    reason                     TEXT,
    -- the operation that asked for it, and the key it is handed to the controller with
    operation_id               TEXT    NOT NULL UNIQUE,
    controller_idempotency_key TEXT    NOT NULL,
    -- the controller's id for the rollout, once the controller took it
    controller_rollout_id      TEXT,
    created_at                 TEXT    NOT NULL,
    updated_at                 TEXT    NOT NULL,
    CHECK ((kind = 'rollback') = (restores IS NOT NULL))
) STRICT;

-- The environment lock: at most one deployment or rollback that may be
-- changing an environment — queued, running, or unknown (it may be running) —
-- per (account, service, environment). The database decides under races.
CREATE UNIQUE INDEX deployments_environment_lock ON deployments (account_id, service, environment)
    WHERE state IN ('queued', 'running', 'unknown');
CREATE INDEX deployments_by_environment ON deployments (account_id, service, environment, list_seq);
CREATE UNIQUE INDEX deployments_listed ON deployments (account_id, list_seq);
-- what the watcher follows: rollouts the controller has, not finished
CREATE INDEX deployments_watched ON deployments (updated_at)
    WHERE state IN ('queued', 'running') AND controller_rollout_id IS NOT NULL;

-- Every state a deployment went through, and why.
CREATE TABLE deployment_history (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    deployment_id TEXT    NOT NULL REFERENCES deployments (id),
    state         TEXT    NOT NULL,
    note          TEXT    NOT NULL,
    at            TEXT    NOT NULL
) STRICT;
CREATE INDEX deployment_history_by_deployment ON deployment_history (deployment_id, seq);

-- Each environment's current release: the last deployment or rollback that
-- succeeded there. `expected_current_deployment_id` is checked against it.
CREATE TABLE environments (
    account_id            TEXT NOT NULL,
    service               TEXT NOT NULL,
    environment           TEXT NOT NULL,
    current_deployment_id TEXT NOT NULL REFERENCES deployments (id),
    updated_at            TEXT NOT NULL,
    PRIMARY KEY (account_id, service, environment)
) STRICT;

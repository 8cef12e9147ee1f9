-- The shape a distributed PostgreSQL shards (docs/design.md §13): every key
-- begins with account_id, the tenant, and the three tables every claim writes
-- are hash-partitioned by it. Upgrades a database in place, keeping every row:
-- each partitioned table is renamed, made again partitioned with the same
-- columns and checks, filled from the old one (its ids continued), and the old
-- one dropped. The upgrade holds the three tables for the copy: run it with the
-- services stopped.
--
-- Eight partitions: each per-account statement prunes to one of them, and the
-- statements that reach across accounts (the chainer's round, the outbox's due
-- scan, the reaper, the gauges) pay one index probe per partition, so a
-- handful keeps that fan-out cheap while each index and each vacuum is an
-- eighth of the table's. Eight also splits evenly into sixteen.
--
-- What cannot begin with account_id, and how a distributed PostgreSQL holds it:
--   audit_journal: `seq` is one hash chain across every account, each entry
--     linked onto the one before whatever its account; it stays one table (on
--     Citus, on the coordinator, or a reference table). A chain per partition,
--     each with its own head, would let it shard: future work.
--   api_keys (platform's migration): looked up by the key's hash before any
--     account is known; a reference table on Citus, copied to every node.

-- Operations ----------------------------------------------------------------

ALTER TABLE idempotency_approvals DROP CONSTRAINT idempotency_approvals_operation_id_fkey;
ALTER TABLE idempotency_outbox DROP CONSTRAINT idempotency_outbox_operation_id_fkey;

ALTER TABLE idempotency_operations RENAME TO idempotency_operations_before;

CREATE TABLE idempotency_operations (
    account_id            TEXT        NOT NULL,
    idempotency_key       TEXT        NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    operation_id          TEXT        NOT NULL,
    principal_id          TEXT        NOT NULL,
    method                TEXT        NOT NULL,
    route                 TEXT        NOT NULL,
    fingerprint           TEXT        NOT NULL CHECK (length(fingerprint) = 64),
    state                 TEXT        NOT NULL CHECK (state IN
                              ('in_progress', 'awaiting_approval', 'completed', 'failed', 'unknown', 'rejected')),
    lease_token           TEXT,
    locked_until          TIMESTAMPTZ,
    attempts              INTEGER     NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    response_status       INTEGER,
    response_content_type TEXT,
    response_location     TEXT,
    response_body         BYTEA,
    resource_type         TEXT,
    resource_id           TEXT,
    resource_url          TEXT,
    external_ref          TEXT,
    created_at            TIMESTAMPTZ NOT NULL,
    updated_at            TIMESTAMPTZ NOT NULL,
    approval_id           TEXT,
    CONSTRAINT idempotency_operations_lease_whole
        CHECK ((lease_token IS NULL) = (locked_until IS NULL)),
    CONSTRAINT idempotency_operations_lease_only_in_progress
        CHECK (lease_token IS NULL OR state = 'in_progress'),
    CONSTRAINT idempotency_operations_in_progress_held_or_answered
        CHECK (state <> 'in_progress' OR lease_token IS NOT NULL OR response_status IS NOT NULL),
    CHECK (state NOT IN ('completed', 'failed', 'rejected') OR (response_status IS NOT NULL AND response_body IS NOT NULL))
) PARTITION BY HASH (account_id);
CREATE TABLE idempotency_operations_0 PARTITION OF idempotency_operations FOR VALUES WITH (MODULUS 8, REMAINDER 0);
CREATE TABLE idempotency_operations_1 PARTITION OF idempotency_operations FOR VALUES WITH (MODULUS 8, REMAINDER 1);
CREATE TABLE idempotency_operations_2 PARTITION OF idempotency_operations FOR VALUES WITH (MODULUS 8, REMAINDER 2);
CREATE TABLE idempotency_operations_3 PARTITION OF idempotency_operations FOR VALUES WITH (MODULUS 8, REMAINDER 3);
CREATE TABLE idempotency_operations_4 PARTITION OF idempotency_operations FOR VALUES WITH (MODULUS 8, REMAINDER 4);
CREATE TABLE idempotency_operations_5 PARTITION OF idempotency_operations FOR VALUES WITH (MODULUS 8, REMAINDER 5);
CREATE TABLE idempotency_operations_6 PARTITION OF idempotency_operations FOR VALUES WITH (MODULUS 8, REMAINDER 6);
CREATE TABLE idempotency_operations_7 PARTITION OF idempotency_operations FOR VALUES WITH (MODULUS 8, REMAINDER 7);

INSERT INTO idempotency_operations SELECT * FROM idempotency_operations_before;
DROP TABLE idempotency_operations_before;

-- the keys once the rows are in: one index build each instead of a row at a time
ALTER TABLE idempotency_operations ADD PRIMARY KEY (account_id, idempotency_key);
ALTER TABLE idempotency_operations ADD CONSTRAINT idempotency_operations_operation_id_key
    UNIQUE (account_id, operation_id);
-- the retention reaper walks operation ids (UUIDv7, in creation order) up to
-- its cutoff across every account: the unique key no longer serves that walk
CREATE INDEX idempotency_operations_by_age ON idempotency_operations (operation_id);
CREATE INDEX idempotency_operations_unfinished ON idempotency_operations (state, updated_at)
    WHERE state IN ('in_progress', 'awaiting_approval', 'unknown');

-- Approvals: few, and read by account; not partitioned, keyed by account --------

ALTER TABLE idempotency_approvals DROP CONSTRAINT idempotency_approvals_pkey;
ALTER TABLE idempotency_approvals ADD PRIMARY KEY (account_id, seq);
ALTER TABLE idempotency_approvals DROP CONSTRAINT idempotency_approvals_approval_id_key;
ALTER TABLE idempotency_approvals ADD CONSTRAINT idempotency_approvals_approval_id_key
    UNIQUE (account_id, approval_id);
ALTER TABLE idempotency_approvals DROP CONSTRAINT idempotency_approvals_operation_id_key;
ALTER TABLE idempotency_approvals ADD CONSTRAINT idempotency_approvals_operation_id_key
    UNIQUE (account_id, operation_id);
ALTER TABLE idempotency_approvals ADD CONSTRAINT idempotency_approvals_operation_id_fkey
    FOREIGN KEY (account_id, operation_id) REFERENCES idempotency_operations (account_id, operation_id)
    ON DELETE CASCADE;

-- The outbox ------------------------------------------------------------------

ALTER TABLE idempotency_outbox RENAME TO idempotency_outbox_before;
ALTER SEQUENCE idempotency_outbox_seq_seq RENAME TO idempotency_outbox_before_seq_seq;

CREATE TABLE idempotency_outbox (
    seq             BIGINT      GENERATED ALWAYS AS IDENTITY,
    event_id        TEXT        NOT NULL,
    account_id      TEXT        NOT NULL,
    operation_id    TEXT        NOT NULL,
    idempotency_key TEXT        NOT NULL,
    fingerprint     TEXT        NOT NULL,
    route           TEXT        NOT NULL,
    kind            TEXT        NOT NULL,
    payload         TEXT        NOT NULL,
    external_key    TEXT        NOT NULL,
    state           TEXT        NOT NULL CHECK (state IN ('pending', 'sending', 'unknown', 'delivered', 'failed', 'dead')),
    deliveries      INTEGER     NOT NULL DEFAULT 0 CHECK (deliveries >= 0),
    failures        INTEGER     NOT NULL DEFAULT 0 CHECK (failures >= 0),
    lease_token     TEXT,
    next_attempt_at TIMESTAMPTZ NOT NULL,
    external_ref    TEXT,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    CHECK (state <> 'sending' OR lease_token IS NOT NULL),
    CHECK (lease_token IS NULL OR state IN ('sending', 'unknown'))
) PARTITION BY HASH (account_id);
CREATE TABLE idempotency_outbox_0 PARTITION OF idempotency_outbox FOR VALUES WITH (MODULUS 8, REMAINDER 0);
CREATE TABLE idempotency_outbox_1 PARTITION OF idempotency_outbox FOR VALUES WITH (MODULUS 8, REMAINDER 1);
CREATE TABLE idempotency_outbox_2 PARTITION OF idempotency_outbox FOR VALUES WITH (MODULUS 8, REMAINDER 2);
CREATE TABLE idempotency_outbox_3 PARTITION OF idempotency_outbox FOR VALUES WITH (MODULUS 8, REMAINDER 3);
CREATE TABLE idempotency_outbox_4 PARTITION OF idempotency_outbox FOR VALUES WITH (MODULUS 8, REMAINDER 4);
CREATE TABLE idempotency_outbox_5 PARTITION OF idempotency_outbox FOR VALUES WITH (MODULUS 8, REMAINDER 5);
CREATE TABLE idempotency_outbox_6 PARTITION OF idempotency_outbox FOR VALUES WITH (MODULUS 8, REMAINDER 6);
CREATE TABLE idempotency_outbox_7 PARTITION OF idempotency_outbox FOR VALUES WITH (MODULUS 8, REMAINDER 7);

INSERT INTO idempotency_outbox OVERRIDING SYSTEM VALUE SELECT * FROM idempotency_outbox_before;
-- new events sort after every kept one, as the old sequence would have had them
SELECT setval(pg_get_serial_sequence('idempotency_outbox', 'seq'), last)
FROM (SELECT GREATEST((SELECT MAX(seq) FROM idempotency_outbox),
                      pg_sequence_last_value('idempotency_outbox_before_seq_seq')) AS last) AS kept
WHERE last IS NOT NULL;
DROP TABLE idempotency_outbox_before;

ALTER TABLE idempotency_outbox ADD PRIMARY KEY (account_id, seq);
ALTER TABLE idempotency_outbox ADD CONSTRAINT idempotency_outbox_event_id_key UNIQUE (account_id, event_id);
ALTER TABLE idempotency_outbox ADD CONSTRAINT idempotency_outbox_operation_id_key UNIQUE (account_id, operation_id);
ALTER TABLE idempotency_outbox ADD CONSTRAINT idempotency_outbox_external_key_key UNIQUE (account_id, external_key);
ALTER TABLE idempotency_outbox ADD CONSTRAINT idempotency_outbox_operation_id_fkey
    FOREIGN KEY (account_id, operation_id) REFERENCES idempotency_operations (account_id, operation_id)
    ON DELETE CASCADE;
CREATE INDEX idempotency_outbox_due ON idempotency_outbox (next_attempt_at)
    WHERE state IN ('pending', 'sending', 'unknown');
CREATE INDEX idempotency_outbox_unsettled ON idempotency_outbox (account_id, seq)
    WHERE state NOT IN ('delivered', 'failed');

-- The journal's inbox -----------------------------------------------------------

ALTER TABLE audit_inbox RENAME TO audit_inbox_before;

CREATE TABLE audit_inbox (
    -- one sequence across every account: the chainer takes records in its order
    id              BIGINT      NOT NULL DEFAULT nextval('audit_inbox_id_seq'),
    account_id      TEXT        NOT NULL,
    principal_id    TEXT        NOT NULL,
    operation_id    TEXT,
    idempotency_key TEXT,
    fingerprint     TEXT,
    route           TEXT,
    event           TEXT        NOT NULL,
    external_ref    TEXT,
    at              TIMESTAMPTZ NOT NULL,
    attempt         BIGINT      CHECK (attempt >= 1),
    resource_type   TEXT,
    resource_id     TEXT,
    state           TEXT,
    evidence        TEXT
) PARTITION BY HASH (account_id);
-- a queue: each partition keeps the vacuum settings the table had (see 0002)
CREATE TABLE audit_inbox_0 PARTITION OF audit_inbox FOR VALUES WITH (MODULUS 8, REMAINDER 0)
    WITH (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0,
          autovacuum_vacuum_insert_threshold = 1000, vacuum_truncate = false);
CREATE TABLE audit_inbox_1 PARTITION OF audit_inbox FOR VALUES WITH (MODULUS 8, REMAINDER 1)
    WITH (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0,
          autovacuum_vacuum_insert_threshold = 1000, vacuum_truncate = false);
CREATE TABLE audit_inbox_2 PARTITION OF audit_inbox FOR VALUES WITH (MODULUS 8, REMAINDER 2)
    WITH (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0,
          autovacuum_vacuum_insert_threshold = 1000, vacuum_truncate = false);
CREATE TABLE audit_inbox_3 PARTITION OF audit_inbox FOR VALUES WITH (MODULUS 8, REMAINDER 3)
    WITH (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0,
          autovacuum_vacuum_insert_threshold = 1000, vacuum_truncate = false);
CREATE TABLE audit_inbox_4 PARTITION OF audit_inbox FOR VALUES WITH (MODULUS 8, REMAINDER 4)
    WITH (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0,
          autovacuum_vacuum_insert_threshold = 1000, vacuum_truncate = false);
CREATE TABLE audit_inbox_5 PARTITION OF audit_inbox FOR VALUES WITH (MODULUS 8, REMAINDER 5)
    WITH (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0,
          autovacuum_vacuum_insert_threshold = 1000, vacuum_truncate = false);
CREATE TABLE audit_inbox_6 PARTITION OF audit_inbox FOR VALUES WITH (MODULUS 8, REMAINDER 6)
    WITH (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0,
          autovacuum_vacuum_insert_threshold = 1000, vacuum_truncate = false);
CREATE TABLE audit_inbox_7 PARTITION OF audit_inbox FOR VALUES WITH (MODULUS 8, REMAINDER 7)
    WITH (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0,
          autovacuum_vacuum_insert_threshold = 1000, vacuum_truncate = false);

INSERT INTO audit_inbox SELECT * FROM audit_inbox_before;
-- the sequence goes on, now the new table's
ALTER SEQUENCE audit_inbox_id_seq OWNED BY audit_inbox.id;
DROP TABLE audit_inbox_before;

ALTER TABLE audit_inbox ADD PRIMARY KEY (account_id, id);
-- the chainer's order across every account: one probe per partition, merged
CREATE INDEX audit_inbox_in_order ON audit_inbox (id);

-- One row per operation: an account's idempotency key, claimed before any effect.
-- The primary key is what makes the claim atomic: a second INSERT of the same
-- (account_id, idempotency_key) conflicts instead of creating a second operation.
-- Times are fixed-width RFC 3339 UTC text (platform::time::Timestamp), so text order is time order.
-- A rowid table, not WITHOUT ROWID: a row carries a stored answer of hundreds of
-- bytes, and SQLite advises WITHOUT ROWID only for small rows.
CREATE TABLE idempotency_operations (
    account_id            TEXT    NOT NULL,
    idempotency_key       TEXT    NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    operation_id          TEXT    NOT NULL UNIQUE,
    principal_id          TEXT    NOT NULL,
    method                TEXT    NOT NULL,
    route                 TEXT    NOT NULL,
    fingerprint           TEXT    NOT NULL CHECK (length(fingerprint) = 64),
    state                 TEXT    NOT NULL CHECK (state IN
                              ('in_progress', 'awaiting_approval', 'completed', 'failed', 'unknown', 'rejected')),
    -- the lease of the attempt that is running the operation: only while in_progress
    lease_token           TEXT,
    locked_until          TEXT,
    attempts              INTEGER NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    -- the first answer, replayed byte for byte
    response_status       INTEGER,
    response_content_type TEXT,
    response_location     TEXT,
    response_body         BLOB,
    resource_type         TEXT,
    resource_id           TEXT,
    resource_url          TEXT,
    external_ref          TEXT,
    created_at            TEXT    NOT NULL,
    updated_at            TEXT    NOT NULL,
    PRIMARY KEY (account_id, idempotency_key),
    CHECK ((state = 'in_progress') = (lease_token IS NOT NULL AND locked_until IS NOT NULL)),
    CHECK (state NOT IN ('completed', 'failed', 'rejected') OR (response_status IS NOT NULL AND response_body IS NOT NULL))
) STRICT;

-- what the retention reaper scans: finished operations by age
CREATE INDEX idempotency_operations_finished_by_age
    ON idempotency_operations (updated_at)
    WHERE state IN ('completed', 'failed', 'rejected');

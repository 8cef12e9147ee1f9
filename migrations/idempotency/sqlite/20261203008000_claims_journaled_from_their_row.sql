-- no-transaction
-- On SQLite a claim that finishes in its own transaction (the create's hot
-- path) no longer writes its journal entries there: its operation row carries
-- what they say, and the journal's chain round makes them from it (issue 7).
-- SQLite writes every page a transaction changed, whole, into the WAL at
-- commit; the three entries changed about five more pages per create (the
-- journal and its two indexes, and their splits), as many as the claim
-- itself. A round links the claims of hundreds of creates in a few pages.
--
-- The round finds the claims it has not linked yet by `seq`: AUTOINCREMENT
-- never hands out a number twice, and SQLite has one writer at a time, so a
-- claim that commits always has a higher `seq` than every claim committed
-- before it, and `audit_progress` can say "every claim up to here is linked".
-- (A plain rowid can be handed out again once the row holding the highest one
-- is deleted, and a claim would then hide under the mark.)
--
-- New columns, NULL for an operation whose claim was journaled otherwise (a
-- lease, an approval, or a claim made before this migration):
--   attempted_at  when the attempt that made the claim started;
--   claimed_state the state the claim stored, which says the claim's last
--                 entry: completed, failed, or none while the outbox works.
--
-- The table is rebuilt the way SQLite documents, with foreign keys off so that
-- dropping the old table cascades nothing into idempotency_approvals and
-- idempotency_outbox (see 20261203000100_outbox.sql). sqlx records a migration
-- that runs outside its transaction only after it commits, and takes no lock
-- on SQLite: the transaction starts by creating the mark's table, so a second
-- run (two processes starting at once) fails there and changes nothing.
PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;

-- How far the chain round has linked claims: every claim with a lower or
-- equal seq is in the journal. One row, moved by the round that links them.
CREATE TABLE audit_progress (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    operations_seq INTEGER NOT NULL
) STRICT;

CREATE TABLE idempotency_operations_sequenced (
    seq                   INTEGER PRIMARY KEY AUTOINCREMENT,
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
    approval_id           TEXT,
    -- the claim's journal entries, made from this row by the chain round
    attempted_at          TEXT,
    claimed_state         TEXT    CHECK (claimed_state IN ('in_progress', 'completed', 'failed')),
    -- what makes the claim atomic: a second claim of the key conflicts
    UNIQUE (account_id, idempotency_key),
    CHECK ((attempted_at IS NULL) = (claimed_state IS NULL)),
    CHECK ((lease_token IS NULL) = (locked_until IS NULL)),
    CHECK (lease_token IS NULL OR state = 'in_progress'),
    CHECK (state <> 'in_progress' OR lease_token IS NOT NULL OR response_status IS NOT NULL),
    CHECK (state NOT IN ('completed', 'failed', 'rejected') OR (response_status IS NOT NULL AND response_body IS NOT NULL))
) STRICT;

INSERT INTO idempotency_operations_sequenced
    (seq, account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state,
     lease_token, locked_until, attempts, response_status, response_content_type, response_location,
     response_body, resource_type, resource_id, resource_url, external_ref, created_at, updated_at, approval_id)
SELECT rowid, account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state,
       lease_token, locked_until, attempts, response_status, response_content_type, response_location,
       response_body, resource_type, resource_id, resource_url, external_ref, created_at, updated_at, approval_id
FROM idempotency_operations ORDER BY rowid;

DROP TABLE idempotency_operations;
ALTER TABLE idempotency_operations_sequenced RENAME TO idempotency_operations;

-- the operations already here were journaled when they were made
INSERT INTO audit_progress (id, operations_seq)
SELECT 1, coalesce(max(seq), 0) FROM idempotency_operations;

COMMIT;
PRAGMA foreign_keys = ON;

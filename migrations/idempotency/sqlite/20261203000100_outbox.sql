-- no-transaction
-- Work that leaves the process goes through an outbox (CONTRACT §5): the
-- effect, the operation's first answer (a 202) and the event that will carry
-- the work to the external system commit in one transaction. The operation then
-- stays `in_progress` while the outbox delivers — with its answer stored (every
-- retry replays it) and no lease, because no attempt runs it any more and none
-- may take it over. So the lease rule becomes: a lease only while in_progress,
-- and an in_progress operation either has a lease or has answered.
--
-- SQLite cannot change a CHECK constraint in place: the table is rebuilt the way
-- SQLite documents (https://sqlite.org/lang_altertable.html#otheralter), with
-- foreign keys off so that dropping the old table cascades nothing into
-- idempotency_approvals, whose references then name the new table. PRAGMA
-- foreign_keys only works outside a transaction, hence `no-transaction` above
-- and the explicit transaction below. Run again after a crash between its
-- COMMIT and sqlx recording it, it does the same again (IF NOT EXISTS).
PRAGMA foreign_keys = OFF;
BEGIN IMMEDIATE;

CREATE TABLE idempotency_operations_rebuilt (
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
    PRIMARY KEY (account_id, idempotency_key),
    CHECK ((lease_token IS NULL) = (locked_until IS NULL)),
    CHECK (lease_token IS NULL OR state = 'in_progress'),
    CHECK (state <> 'in_progress' OR lease_token IS NOT NULL OR response_status IS NOT NULL),
    CHECK (state NOT IN ('completed', 'failed', 'rejected') OR (response_status IS NOT NULL AND response_body IS NOT NULL))
) STRICT;

INSERT INTO idempotency_operations_rebuilt
    (account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state,
     lease_token, locked_until, attempts, response_status, response_content_type, response_location,
     response_body, resource_type, resource_id, resource_url, external_ref, created_at, updated_at, approval_id)
SELECT account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state,
       lease_token, locked_until, attempts, response_status, response_content_type, response_location,
       response_body, resource_type, resource_id, resource_url, external_ref, created_at, updated_at, approval_id
FROM idempotency_operations;

DROP TABLE idempotency_operations;
ALTER TABLE idempotency_operations_rebuilt RENAME TO idempotency_operations;

-- what the retention reaper scans: finished operations by age
CREATE INDEX idempotency_operations_finished_by_age
    ON idempotency_operations (updated_at)
    WHERE state IN ('completed', 'failed', 'rejected');

-- One event per operation whose work leaves the process. A worker delivers
-- it with `external_key` as the external system's idempotency key, the same on
-- every delivery and after every restart; a reconciler asks the external
-- system what became of one whose answer was lost (see idempotency::outbox).
CREATE TABLE IF NOT EXISTS idempotency_outbox (
    seq             INTEGER PRIMARY KEY,
    event_id        TEXT    NOT NULL UNIQUE,
    account_id      TEXT    NOT NULL,
    -- one delivery per operation; it goes when the reaper removes its finished operation
    operation_id    TEXT    NOT NULL UNIQUE
                            REFERENCES idempotency_operations (operation_id) ON DELETE CASCADE,
    -- the operation's key, fingerprint and route, for the journal entries of each delivery
    idempotency_key TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    route           TEXT    NOT NULL,
    -- what to deliver, in the service's words (`capture`, `refund`, `rollout`…), and its JSON
    kind            TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    external_key    TEXT    NOT NULL UNIQUE,
    -- pending: to be sent; sending: a worker holds it and may have sent it;
    -- unknown: sent, and the answer was lost; delivered, failed: the answer is known
    state           TEXT    NOT NULL CHECK (state IN ('pending', 'sending', 'unknown', 'delivered', 'failed')),
    -- how many times it was handed to the external system
    deliveries      INTEGER NOT NULL DEFAULT 0 CHECK (deliveries >= 0),
    -- the worker or reconciler holding the event; its hold ends at next_attempt_at
    lease_token     TEXT,
    -- when the event is due: the next try, or the end of its holder's lease
    next_attempt_at TEXT    NOT NULL,
    external_ref    TEXT,
    last_error      TEXT,
    created_at      TEXT    NOT NULL,
    updated_at      TEXT    NOT NULL,
    CHECK (state <> 'sending' OR lease_token IS NOT NULL),
    CHECK (lease_token IS NULL OR state IN ('sending', 'unknown'))
) STRICT;
-- what the worker and the reconciler scan: events not settled yet, by when they are due
CREATE INDEX IF NOT EXISTS idempotency_outbox_due ON idempotency_outbox (next_attempt_at)
    WHERE state IN ('pending', 'sending', 'unknown');

COMMIT;
PRAGMA foreign_keys = ON;

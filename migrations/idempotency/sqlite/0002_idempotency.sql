-- The idempotency layer's tables: operations (the claimed keys and their
-- stored answers), approvals, the outbox, and the audit journal with its inbox.
-- Times are fixed-width RFC 3339 UTC text (platform::time::Timestamp), so text
-- order is time order. Every table is scoped by account_id.
-- A CHECK that allows more than two values spells them as comparisons
-- (state = 'a' OR ...), not IN: SQLite builds a temporary b-tree for an IN
-- list of more than two values each time a statement evaluates it, and a
-- CHECK is evaluated by every write of its row. So does the operations'
-- partial index, which every claim evaluates, and the outbox's, which every
-- event's write evaluates; a query that reads a partial index repeats its
-- WHERE in this spelling (docs/design.md §9).

-- One row per operation: an account's idempotency key, claimed before any
-- effect. The primary key makes the claim atomic: a second INSERT of the same
-- (account_id, idempotency_key) conflicts instead of making a second operation.
-- No index serves the retention reaper: operation ids are UUIDv7 and sort by
-- creation time, so the reaper walks the operation_id index up to its cutoff.
-- A rowid table: a row carries a stored answer of hundreds of bytes, and
-- SQLite advises WITHOUT ROWID only for small rows.
CREATE TABLE idempotency_operations (
    account_id            TEXT    NOT NULL,
    idempotency_key       TEXT    NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    operation_id          TEXT    NOT NULL UNIQUE,
    principal_id          TEXT    NOT NULL,
    method                TEXT    NOT NULL,
    route                 TEXT    NOT NULL,
    fingerprint           TEXT    NOT NULL CHECK (length(fingerprint) = 64),
    state                 TEXT    NOT NULL CHECK (state = 'in_progress' OR state = 'awaiting_approval'
                              OR state = 'completed' OR state = 'failed' OR state = 'unknown' OR state = 'rejected'),
    -- the lease of the attempt running the operation
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
    -- the approval an attempt re-checks in the effect's transaction before it runs the operation
    approval_id           TEXT,
    PRIMARY KEY (account_id, idempotency_key),
    CONSTRAINT idempotency_operations_lease_whole
        CHECK ((lease_token IS NULL) = (locked_until IS NULL)),
    CONSTRAINT idempotency_operations_lease_only_in_progress
        CHECK (lease_token IS NULL OR state = 'in_progress'),
    -- in progress: an attempt holds it, or it has answered (202) and the outbox works on
    CONSTRAINT idempotency_operations_in_progress_held_or_answered
        CHECK (state <> 'in_progress' OR lease_token IS NOT NULL OR response_status IS NOT NULL),
    -- finished (completed, failed, rejected): its answer is stored; the states
    -- not named here are the unfinished ones of the state CHECK above
    CHECK (state = 'in_progress' OR state = 'awaiting_approval' OR state = 'unknown'
           OR (response_status IS NOT NULL AND response_body IS NOT NULL))
) STRICT;

-- what an operator watches: operations not finished, by state and age (a
-- claim that finishes in its own transaction is never in it)
CREATE INDEX idempotency_operations_unfinished ON idempotency_operations (state, updated_at)
    WHERE state = 'in_progress' OR state = 'awaiting_approval' OR state = 'unknown';

-- A human decision bound to one operation and its exact fingerprint.
CREATE TABLE idempotency_approvals (
    -- creation order, for cursors
    seq             INTEGER PRIMARY KEY,
    -- its place in the account's lists, given in commit order when a list is read
    list_seq        INTEGER,
    approval_id     TEXT    NOT NULL UNIQUE,
    account_id      TEXT    NOT NULL,
    -- one approval per operation; it goes when the reaper removes its operation
    operation_id    TEXT    NOT NULL UNIQUE
                            REFERENCES idempotency_operations (operation_id) ON DELETE CASCADE,
    idempotency_key TEXT    NOT NULL,
    route           TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL CHECK (length(fingerprint) = 64),
    -- what the human judges: target, action, consequences, identifiers (JSON)
    summary         TEXT    NOT NULL,
    requested_by    TEXT    NOT NULL,
    created_at      TEXT    NOT NULL,
    expires_at      TEXT    NOT NULL,
    -- NULL while pending; a decision is made once and never changes
    decision        TEXT    CHECK (decision = 'approved' OR decision = 'rejected' OR decision = 'expired'),
    decided_by      TEXT,
    decided_at      TEXT,
    CHECK ((decision IS NULL) = (decided_at IS NULL)),
    CHECK (decision NOT IN ('approved', 'rejected') OR decided_by IS NOT NULL),
    -- the requester never approves their own operation
    CHECK (decided_by IS NULL OR decided_by <> requested_by)
) STRICT;
-- the approval console's query: an account's pending approvals, oldest first
CREATE INDEX idempotency_approvals_pending
    ON idempotency_approvals (account_id, list_seq) WHERE decision IS NULL;
CREATE UNIQUE INDEX idempotency_approvals_listed ON idempotency_approvals (account_id, list_seq);

-- One event per operation whose work leaves the process, written in the
-- transaction of the effect. A worker delivers it with `external_key` as the
-- external system's idempotency key, the same on every delivery and after
-- every restart; a reconciler asks the external system what became of one
-- whose answer was lost (see idempotency::outbox).
CREATE TABLE idempotency_outbox (
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
    -- unknown: sent, and the answer was lost; delivered, failed: the answer is known;
    -- dead: it failed too often to be tried again, until an admin sends it again
    state           TEXT    NOT NULL CHECK (state = 'pending' OR state = 'sending' OR state = 'unknown'
                                            OR state = 'delivered' OR state = 'failed' OR state = 'dead'),
    -- how many times it was handed to the external system
    deliveries      INTEGER NOT NULL DEFAULT 0 CHECK (deliveries >= 0),
    -- how many deliveries and lookups came to nothing known, and how many
    -- settlements could not be written; at the outbox's limit the event is dead
    failures        INTEGER NOT NULL DEFAULT 0 CHECK (failures >= 0),
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
CREATE INDEX idempotency_outbox_due ON idempotency_outbox (next_attempt_at)
    WHERE state = 'pending' OR state = 'sending' OR state = 'unknown';
-- what an admin looks at: operations whose outcome is unknown (their events are
-- never delivered or failed) and dead events, by account
CREATE INDEX idempotency_outbox_unsettled ON idempotency_outbox (account_id, seq)
    WHERE state NOT IN ('delivered', 'failed');

-- The audit journal: append-only and hash-chained. Each entry's hash covers
-- the previous entry's hash and every field of its own, so an edited, removed
-- or inserted entry breaks the chain from there on. `attempt` numbers the
-- attempt an entry stands for too (an attempt that claimed, ran and finished
-- in one transaction journals only its outcome); `resource_type`,
-- `resource_id` and `state` name a business resource's change of state with
-- no operation behind it (`state_changed`); `evidence` is what a person gave
-- for settling an operation by hand (`resolved`). Each is NULL otherwise, and
-- then left out of the hash.
CREATE TABLE audit_journal (
    seq             INTEGER PRIMARY KEY,
    account_id      TEXT    NOT NULL,
    principal_id    TEXT    NOT NULL,
    operation_id    TEXT,
    idempotency_key TEXT,
    fingerprint     TEXT,
    route           TEXT,
    event           TEXT    NOT NULL,
    external_ref    TEXT,
    at              TEXT    NOT NULL,
    attempt         INTEGER CHECK (attempt >= 1),
    prev_hash       TEXT    NOT NULL CHECK (length(prev_hash) = 64),
    hash            TEXT    NOT NULL CHECK (length(hash) = 64),
    resource_type   TEXT,
    resource_id     TEXT,
    state           TEXT,
    evidence        TEXT
) STRICT;
CREATE INDEX audit_journal_by_operation ON audit_journal (account_id, operation_id);
-- the audit API's filter by time range
CREATE INDEX audit_journal_by_time ON audit_journal (account_id, at);

-- SQLite has no TRUNCATE: `DELETE FROM audit_journal` is refused by the delete trigger.
CREATE TRIGGER audit_journal_no_update BEFORE UPDATE ON audit_journal
BEGIN
    SELECT RAISE(ABORT, 'audit_journal is append-only: UPDATE refused');
END;
CREATE TRIGGER audit_journal_no_delete BEFORE DELETE ON audit_journal
BEGIN
    SELECT RAISE(ABORT, 'audit_journal is append-only: DELETE refused');
END;
-- `INSERT OR REPLACE` (or any conflict clause that says REPLACE) deletes the
-- entry it conflicts with without firing the delete trigger, and a forged
-- entry that links onto the one before would pass the link check: an insert
-- at a seq that is taken is refused before any conflict clause applies.
CREATE TRIGGER audit_journal_no_replace BEFORE INSERT ON audit_journal
WHEN EXISTS (SELECT 1 FROM audit_journal WHERE seq = NEW.seq)
BEGIN
    SELECT RAISE(ABORT, 'audit_journal is append-only: an entry is never replaced');
END;
-- The database checks every entry's link itself: an entry must link onto the
-- entry before it (seq - 1), or be the first, with the genesis hash. With seq
-- the primary key, that refuses a fork, a gap and a second genesis, whoever writes.
CREATE TRIGGER audit_journal_links_onto_the_entry_before BEFORE INSERT ON audit_journal
WHEN NEW.prev_hash IS NOT coalesce(
    (SELECT hash FROM audit_journal WHERE seq = NEW.seq - 1),
    CASE WHEN NEW.seq = 1 THEN '0000000000000000000000000000000000000000000000000000000000000000' END)
BEGIN
    SELECT RAISE(ABORT, 'audit_journal: an entry must link onto the entry before it');
END;

-- The journal's inbox: a transition writes its entries here, in its own
-- transaction, so they commit (or not) with it, and the chainer moves them
-- into the chain in batches, in id order (see idempotency::audit).
CREATE TABLE audit_inbox (
    id              INTEGER PRIMARY KEY,
    account_id      TEXT    NOT NULL,
    principal_id    TEXT    NOT NULL,
    operation_id    TEXT,
    idempotency_key TEXT,
    fingerprint     TEXT,
    route           TEXT,
    event           TEXT    NOT NULL,
    external_ref    TEXT,
    at              TEXT    NOT NULL,
    attempt         INTEGER CHECK (attempt >= 1),
    resource_type   TEXT,
    resource_id     TEXT,
    state           TEXT,
    evidence        TEXT
) STRICT;

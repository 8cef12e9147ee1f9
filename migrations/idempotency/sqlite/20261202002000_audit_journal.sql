-- The audit journal (CONTRACT §8): append-only, hash-chained. Each entry's
-- hash covers the previous entry's hash and every field of its own, so an
-- edited, removed or inserted entry breaks the chain from that point on.
-- SQLite has no TRUNCATE: `DELETE FROM audit_journal` is refused by the delete trigger.
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
    prev_hash       TEXT    NOT NULL CHECK (length(prev_hash) = 64),
    hash            TEXT    NOT NULL CHECK (length(hash) = 64),
    -- one successor per entry: two writers can never fork the chain
    UNIQUE (prev_hash)
) STRICT;
CREATE INDEX audit_journal_by_operation ON audit_journal (account_id, operation_id);

CREATE TRIGGER audit_journal_no_update BEFORE UPDATE ON audit_journal
BEGIN
    SELECT RAISE(ABORT, 'audit_journal is append-only: UPDATE refused');
END;
CREATE TRIGGER audit_journal_no_delete BEFORE DELETE ON audit_journal
BEGIN
    SELECT RAISE(ABORT, 'audit_journal is append-only: DELETE refused');
END;

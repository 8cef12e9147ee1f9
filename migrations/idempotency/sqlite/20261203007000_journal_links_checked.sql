-- The database checks each journal entry's link itself: an entry is refused
-- unless its prev_hash is the hash of the entry before it (seq - 1), or the
-- genesis hash for the first. With seq as the primary key, every entry then
-- has at most one successor (no fork) and no entry is missing before it (no
-- gap), whoever writes. It replaces UNIQUE (prev_hash), which refused a fork
-- only, and cost every entry an insert into an index of random hashes: on
-- SQLite a page written at every commit (issue 7). The check reads the page
-- the append writes anyway.
--
-- SQLite cannot drop a table's UNIQUE constraint: the table is copied into one
-- without it (DROP TABLE fires no trigger), and its indexes and triggers are
-- made again.
CREATE TABLE audit_journal_checked (
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
    hash            TEXT    NOT NULL CHECK (length(hash) = 64)
) STRICT;
INSERT INTO audit_journal_checked
    (seq, account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, external_ref, at,
     prev_hash, hash)
SELECT seq, account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, external_ref, at,
       prev_hash, hash
FROM audit_journal ORDER BY seq;
DROP TABLE audit_journal;
ALTER TABLE audit_journal_checked RENAME TO audit_journal;

CREATE INDEX audit_journal_by_operation ON audit_journal (account_id, operation_id);
-- the audit API's filter by time range
CREATE INDEX audit_journal_by_time ON audit_journal (account_id, at);

CREATE TRIGGER audit_journal_no_update BEFORE UPDATE ON audit_journal
BEGIN
    SELECT RAISE(ABORT, 'audit_journal is append-only: UPDATE refused');
END;
CREATE TRIGGER audit_journal_no_delete BEFORE DELETE ON audit_journal
BEGIN
    SELECT RAISE(ABORT, 'audit_journal is append-only: DELETE refused');
END;
CREATE TRIGGER audit_journal_links_onto_the_entry_before BEFORE INSERT ON audit_journal
WHEN NEW.prev_hash IS NOT coalesce(
    (SELECT hash FROM audit_journal WHERE seq = NEW.seq - 1),
    CASE WHEN NEW.seq = 1 THEN '0000000000000000000000000000000000000000000000000000000000000000' END)
BEGIN
    SELECT RAISE(ABORT, 'audit_journal: an entry must link onto the entry before it');
END;

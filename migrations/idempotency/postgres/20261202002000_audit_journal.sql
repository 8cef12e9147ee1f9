-- The audit journal (CONTRACT §8): append-only, hash-chained. Each entry's
-- hash covers the previous entry's hash and every field of its own, so an
-- edited, removed or inserted entry breaks the chain from that point on.
CREATE TABLE audit_journal (
    seq             BIGINT      PRIMARY KEY,
    account_id      TEXT        NOT NULL,
    principal_id    TEXT        NOT NULL,
    operation_id    TEXT,
    idempotency_key TEXT,
    fingerprint     TEXT,
    route           TEXT,
    event           TEXT        NOT NULL,
    external_ref    TEXT,
    at              TIMESTAMPTZ NOT NULL,
    prev_hash       TEXT        NOT NULL CHECK (length(prev_hash) = 64),
    hash            TEXT        NOT NULL CHECK (length(hash) = 64),
    -- one successor per entry: two writers can never fork the chain
    UNIQUE (prev_hash)
);
CREATE INDEX audit_journal_by_operation ON audit_journal (account_id, operation_id);

CREATE FUNCTION audit_journal_is_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_journal is append-only: % refused', TG_OP;
END;
$$;
CREATE TRIGGER audit_journal_no_update BEFORE UPDATE ON audit_journal
    FOR EACH ROW EXECUTE FUNCTION audit_journal_is_append_only();
CREATE TRIGGER audit_journal_no_delete BEFORE DELETE ON audit_journal
    FOR EACH ROW EXECUTE FUNCTION audit_journal_is_append_only();
CREATE TRIGGER audit_journal_no_truncate BEFORE TRUNCATE ON audit_journal
    FOR EACH STATEMENT EXECUTE FUNCTION audit_journal_is_append_only();

-- Approvals (CONTRACT §6): a human decision bound to one operation and its
-- exact fingerprint. The operation names its approval, so an attempt that
-- runs it re-checks the approval inside the transaction of the effect.
ALTER TABLE idempotency_operations ADD COLUMN approval_id TEXT;

CREATE TABLE idempotency_approvals (
    -- creation order, for cursors
    seq             BIGSERIAL   PRIMARY KEY,
    approval_id     TEXT        NOT NULL UNIQUE,
    account_id      TEXT        NOT NULL,
    -- one approval per operation; it goes when the reaper removes its operation
    operation_id    TEXT        NOT NULL UNIQUE
                                REFERENCES idempotency_operations (operation_id) ON DELETE CASCADE,
    idempotency_key TEXT        NOT NULL,
    route           TEXT        NOT NULL,
    fingerprint     TEXT        NOT NULL CHECK (length(fingerprint) = 64),
    -- what the human judges: target, action, consequences, identifiers (JSON)
    summary         TEXT        NOT NULL,
    requested_by    TEXT        NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL,
    expires_at      TIMESTAMPTZ NOT NULL,
    -- NULL while pending; a decision is made once and never changes
    decision        TEXT        CHECK (decision IN ('approved', 'rejected', 'expired')),
    decided_by      TEXT,
    decided_at      TIMESTAMPTZ,
    CHECK ((decision IS NULL) = (decided_at IS NULL)),
    CHECK (decision NOT IN ('approved', 'rejected') OR decided_by IS NOT NULL),
    -- the requester never approves their own operation
    CHECK (decided_by IS NULL OR decided_by <> requested_by)
);
-- the approval console's query: an account's pending approvals, oldest first
CREATE INDEX idempotency_approvals_pending
    ON idempotency_approvals (account_id, seq) WHERE decision IS NULL;
CREATE INDEX idempotency_approvals_by_account ON idempotency_approvals (account_id, seq);

-- The journal's inbox: a transition of an operation writes its audit events
-- here, in the transaction that makes the transition, so they commit (or not)
-- with it. One chainer moves them into the hash chain in batches; writers
-- never wait for each other on the chain (see idempotency::audit).
CREATE TABLE audit_inbox (
    id              BIGSERIAL   PRIMARY KEY,
    account_id      TEXT        NOT NULL,
    principal_id    TEXT        NOT NULL,
    operation_id    TEXT,
    idempotency_key TEXT,
    fingerprint     TEXT,
    route           TEXT,
    event           TEXT        NOT NULL,
    external_ref    TEXT,
    at              TIMESTAMPTZ NOT NULL
);
-- the audit API's filter by time range
CREATE INDEX audit_journal_by_time ON audit_journal (account_id, at);

-- API keys, stored only as the SHA-256 of the key (docs/contract.md §1).
CREATE TABLE api_keys (
    key_hash     TEXT PRIMARY KEY,
    account_id   TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    role         TEXT NOT NULL CHECK (role IN ('agent', 'approver', 'admin')),
    created_at   TIMESTAMPTZ NOT NULL,
    revoked_at   TIMESTAMPTZ
);

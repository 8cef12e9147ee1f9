-- API keys, stored only as the SHA-256 of the key (docs/contract.md §1).
-- Times are fixed-width RFC 3339 UTC text (platform::time::Timestamp).
CREATE TABLE api_keys (
    key_hash     TEXT PRIMARY KEY,
    account_id   TEXT NOT NULL,
    principal_id TEXT NOT NULL,
    role         TEXT NOT NULL CHECK (role IN ('agent', 'approver', 'admin')),
    created_at   TEXT NOT NULL,
    revoked_at   TEXT
) STRICT;

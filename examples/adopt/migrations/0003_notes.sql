-- The example's own table, in SQL both backends read alike. Its version
-- follows those it is applied with: the platform's (0001, API keys) and the
-- idempotency crate's (0002, operations).
CREATE TABLE notes (
    id           TEXT PRIMARY KEY,
    account_id   TEXT NOT NULL,
    text         TEXT NOT NULL,
    -- the operation that made it: one note per operation, by the database's word
    operation_id TEXT NOT NULL UNIQUE
);

-- Payment intents (CONTRACT §7 Payments): an intention to take an amount for
-- an order. Creating one moves no money. Amounts are integer minor units.
-- Times are fixed-width RFC 3339 UTC text (platform::time::Timestamp).
CREATE TABLE payment_intents (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id             TEXT    NOT NULL UNIQUE,
    account_id     TEXT    NOT NULL,
    order_id       TEXT    NOT NULL,
    amount_minor   INTEGER NOT NULL CHECK (amount_minor > 0),
    currency       TEXT    NOT NULL CHECK (length(currency) = 3),
    payee_name     TEXT    NOT NULL,
    payee_account  TEXT    NOT NULL,
    description    TEXT,
    state          TEXT    NOT NULL CHECK (state IN
                       ('requires_capture', 'processing', 'succeeded', 'failed', 'unknown', 'cancelled')),
    created_at     TEXT    NOT NULL,
    updated_at     TEXT    NOT NULL
) STRICT;

-- Business identity: at most one live intent per order, whatever key made it.
-- A cancelled or failed intent frees the order for a new one.
CREATE UNIQUE INDEX payment_intents_one_live_per_order ON payment_intents (account_id, order_id)
    WHERE state NOT IN ('cancelled', 'failed');
CREATE INDEX payment_intents_by_order ON payment_intents (account_id, order_id, seq);
CREATE INDEX payment_intents_by_account ON payment_intents (account_id, seq);

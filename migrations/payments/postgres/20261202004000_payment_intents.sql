-- Payment intents (CONTRACT §7 Payments): an intention to take an amount for
-- an order. Creating one moves no money. Amounts are integer minor units.
CREATE TABLE payment_intents (
    seq            BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id             TEXT        NOT NULL UNIQUE,
    account_id     TEXT        NOT NULL,
    order_id       TEXT        NOT NULL,
    amount_minor   BIGINT      NOT NULL CHECK (amount_minor > 0),
    currency       TEXT        NOT NULL CHECK (length(currency) = 3),
    payee_name     TEXT        NOT NULL,
    payee_account  TEXT        NOT NULL,
    description    TEXT,
    state          TEXT        NOT NULL CHECK (state IN
                       ('requires_capture', 'processing', 'succeeded', 'failed', 'unknown', 'cancelled')),
    created_at     TIMESTAMPTZ NOT NULL,
    updated_at     TIMESTAMPTZ NOT NULL
);

-- Business identity: at most one live intent per order, whatever key made it.
-- A cancelled or failed intent frees the order for a new one.
CREATE UNIQUE INDEX payment_intents_one_live_per_order ON payment_intents (account_id, order_id)
    WHERE state NOT IN ('cancelled', 'failed');
CREATE INDEX payment_intents_by_order ON payment_intents (account_id, order_id, seq);
CREATE INDEX payment_intents_by_account ON payment_intents (account_id, seq);

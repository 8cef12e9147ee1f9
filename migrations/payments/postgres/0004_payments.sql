-- Payment intents (docs/contract.md §7 Payments): an intention to take an amount for
-- an order. Creating one moves no money. Amounts are integer minor units.
CREATE TABLE payment_intents (
    seq            BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- its place in the account's lists, given in commit order when a list is read
    list_seq       BIGINT,
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
CREATE INDEX payment_intents_by_order ON payment_intents (account_id, order_id, list_seq);
CREATE UNIQUE INDEX payment_intents_listed ON payment_intents (account_id, list_seq);

-- Captures and refunds (docs/contract.md §7 Payments): money that moves through the
-- payment provider, by way of the outbox. Amounts are integer minor units.

-- At most one capture per intent: a capture is made only from
-- `requires_capture`, and the unique intent_id makes sure of it under races.
CREATE TABLE payment_captures (
    seq                      BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- its place in the account's lists, given in commit order when a list is read
    list_seq                 BIGINT,
    id                       TEXT        NOT NULL UNIQUE,
    account_id               TEXT        NOT NULL,
    intent_id                TEXT        NOT NULL UNIQUE REFERENCES payment_intents (id),
    amount_minor             BIGINT      NOT NULL CHECK (amount_minor > 0),
    currency                 TEXT        NOT NULL CHECK (length(currency) = 3),
    -- what the capture's refunds take, or hold while their outcome is unknown:
    -- the database never lets it pass what was captured
    refunded_minor           BIGINT      NOT NULL DEFAULT 0,
    state                    TEXT        NOT NULL CHECK (state IN ('processing', 'succeeded', 'failed', 'unknown')),
    -- the key its charge is sent with: derived from the capture's operation id
    provider_idempotency_key TEXT        NOT NULL,
    -- the provider's id for the charge, once it is known
    provider_charge_id       TEXT,
    created_at               TIMESTAMPTZ NOT NULL,
    updated_at               TIMESTAMPTZ NOT NULL,
    CONSTRAINT payment_captures_refunds_within_capture
        CHECK (refunded_minor >= 0 AND refunded_minor <= amount_minor)
);
CREATE UNIQUE INDEX payment_captures_listed ON payment_captures (account_id, list_seq);

-- Each refund instruction is its own operation, with its own id and key.
CREATE TABLE payment_refunds (
    seq                      BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- its place in the account's lists, given in commit order when a list is read
    list_seq                 BIGINT,
    id                       TEXT        NOT NULL UNIQUE,
    account_id               TEXT        NOT NULL,
    intent_id                TEXT        NOT NULL REFERENCES payment_intents (id),
    capture_id               TEXT        NOT NULL REFERENCES payment_captures (id),
    amount_minor             BIGINT      NOT NULL CHECK (amount_minor > 0),
    currency                 TEXT        NOT NULL CHECK (length(currency) = 3),
    reason                   TEXT,
    state                    TEXT        NOT NULL CHECK (state IN ('processing', 'succeeded', 'failed', 'unknown')),
    -- the key its refund is sent with: derived from the refund's operation id
    provider_idempotency_key TEXT        NOT NULL,
    -- the provider's id for the refund, once it is known
    provider_refund_id       TEXT,
    created_at               TIMESTAMPTZ NOT NULL,
    updated_at               TIMESTAMPTZ NOT NULL
);
CREATE INDEX payment_refunds_by_intent ON payment_refunds (account_id, intent_id, list_seq);
CREATE UNIQUE INDEX payment_refunds_listed ON payment_refunds (account_id, list_seq);

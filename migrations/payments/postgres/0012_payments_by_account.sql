-- The shape a distributed PostgreSQL shards (docs/design.md §13): every key of
-- the payments' tables begins with account_id, and a capture's intent and a
-- refund's capture are found within their account, so the three tables can
-- live on the node of their account. Upgrades in place: only keys change,
-- every row stays.

ALTER TABLE payment_refunds DROP CONSTRAINT payment_refunds_intent_id_fkey;
ALTER TABLE payment_refunds DROP CONSTRAINT payment_refunds_capture_id_fkey;
ALTER TABLE payment_captures DROP CONSTRAINT payment_captures_intent_id_fkey;

ALTER TABLE payment_intents DROP CONSTRAINT payment_intents_pkey;
ALTER TABLE payment_intents ADD PRIMARY KEY (account_id, seq);
ALTER TABLE payment_intents DROP CONSTRAINT payment_intents_id_key;
ALTER TABLE payment_intents ADD CONSTRAINT payment_intents_id_key UNIQUE (account_id, id);

ALTER TABLE payment_captures DROP CONSTRAINT payment_captures_pkey;
ALTER TABLE payment_captures ADD PRIMARY KEY (account_id, seq);
ALTER TABLE payment_captures DROP CONSTRAINT payment_captures_id_key;
ALTER TABLE payment_captures ADD CONSTRAINT payment_captures_id_key UNIQUE (account_id, id);
-- still at most one capture per intent
ALTER TABLE payment_captures DROP CONSTRAINT payment_captures_intent_id_key;
ALTER TABLE payment_captures ADD CONSTRAINT payment_captures_intent_id_key UNIQUE (account_id, intent_id);
ALTER TABLE payment_captures ADD CONSTRAINT payment_captures_intent_id_fkey
    FOREIGN KEY (account_id, intent_id) REFERENCES payment_intents (account_id, id);

ALTER TABLE payment_refunds DROP CONSTRAINT payment_refunds_pkey;
ALTER TABLE payment_refunds ADD PRIMARY KEY (account_id, seq);
ALTER TABLE payment_refunds DROP CONSTRAINT payment_refunds_id_key;
ALTER TABLE payment_refunds ADD CONSTRAINT payment_refunds_id_key UNIQUE (account_id, id);
ALTER TABLE payment_refunds ADD CONSTRAINT payment_refunds_intent_id_fkey
    FOREIGN KEY (account_id, intent_id) REFERENCES payment_intents (account_id, id);
ALTER TABLE payment_refunds ADD CONSTRAINT payment_refunds_capture_id_fkey
    FOREIGN KEY (account_id, capture_id) REFERENCES payment_captures (account_id, id);

-- Work that leaves the process goes through an outbox (CONTRACT §5): the
-- effect, the operation's first answer (a 202) and the event that will carry
-- the work to the external system commit in one transaction. The operation then
-- stays `in_progress` while the outbox delivers — with its answer stored (every
-- retry replays it) and no lease, because no attempt runs it any more and none
-- may take it over. So the lease rule becomes: a lease only while in_progress,
-- and an in_progress operation either has a lease or has answered.
ALTER TABLE idempotency_operations DROP CONSTRAINT idempotency_operations_check;
ALTER TABLE idempotency_operations
    ADD CONSTRAINT idempotency_operations_lease_whole
        CHECK ((lease_token IS NULL) = (locked_until IS NULL)),
    ADD CONSTRAINT idempotency_operations_lease_only_in_progress
        CHECK (lease_token IS NULL OR state = 'in_progress'),
    ADD CONSTRAINT idempotency_operations_in_progress_held_or_answered
        CHECK (state <> 'in_progress' OR lease_token IS NOT NULL OR response_status IS NOT NULL);

-- One event per operation whose work leaves the process. A worker delivers
-- it with `external_key` as the external system's idempotency key, the same on
-- every delivery and after every restart; a reconciler asks the external
-- system what became of one whose answer was lost (see idempotency::outbox).
CREATE TABLE idempotency_outbox (
    seq             BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        TEXT        NOT NULL UNIQUE,
    account_id      TEXT        NOT NULL,
    -- one delivery per operation; it goes when the reaper removes its finished operation
    operation_id    TEXT        NOT NULL UNIQUE
                                REFERENCES idempotency_operations (operation_id) ON DELETE CASCADE,
    -- the operation's key, fingerprint and route, for the journal entries of each delivery
    idempotency_key TEXT        NOT NULL,
    fingerprint     TEXT        NOT NULL,
    route           TEXT        NOT NULL,
    -- what to deliver, in the service's words (`capture`, `refund`, `rollout`…), and its JSON
    kind            TEXT        NOT NULL,
    payload         TEXT        NOT NULL,
    external_key    TEXT        NOT NULL UNIQUE,
    -- pending: to be sent; sending: a worker holds it and may have sent it;
    -- unknown: sent, and the answer was lost; delivered, failed: the answer is known
    state           TEXT        NOT NULL CHECK (state IN ('pending', 'sending', 'unknown', 'delivered', 'failed')),
    -- how many times it was handed to the external system
    deliveries      INTEGER     NOT NULL DEFAULT 0 CHECK (deliveries >= 0),
    -- the worker or reconciler holding the event; its hold ends at next_attempt_at
    lease_token     TEXT,
    -- when the event is due: the next try, or the end of its holder's lease
    next_attempt_at TIMESTAMPTZ NOT NULL,
    external_ref    TEXT,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL,
    CHECK (state <> 'sending' OR lease_token IS NOT NULL),
    CHECK (lease_token IS NULL OR state IN ('sending', 'unknown'))
);
-- what the worker and the reconciler scan: events not settled yet, by when they are due
CREATE INDEX idempotency_outbox_due ON idempotency_outbox (next_attempt_at)
    WHERE state IN ('pending', 'sending', 'unknown');

-- The data set the plans are measured on: 100,000 operations of 1,000
-- accounts over nine days, as a busy deployment keeps them between two runs
-- of the reaper. Most are finished; a few of each state every cross-account
-- scan looks for. Operation ids sort by creation time, as UUIDv7 ones do.

INSERT INTO idempotency_operations (account_id, idempotency_key, operation_id, principal_id, method, route,
    fingerprint, state, lease_token, locked_until, response_status, response_body, approval_id,
    created_at, updated_at)
SELECT 'acct_' || (i % 1000), 'key-' || i,
       'op_' || lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || substr(md5(i::text), 1, 20),
       'agent', 'POST', '/v1/things', repeat('a', 64), state,
       CASE WHEN held THEN 'lease-' || i END,
       CASE WHEN held THEN now() + interval '30 seconds' END,
       CASE WHEN state = 'awaiting_approval' OR held THEN NULL ELSE 200 END,
       CASE WHEN state = 'awaiting_approval' OR held THEN NULL ELSE '\x7b7d'::bytea END,
       CASE WHEN state = 'awaiting_approval' THEN 'apr-' || i END,
       at, at
FROM (SELECT i, now() - (100000 - i) * interval '8 seconds' AS at,
             CASE WHEN i % 100 = 1 THEN 'in_progress' WHEN i % 100 = 2 THEN 'unknown'
                  WHEN i % 100 = 3 THEN 'awaiting_approval' ELSE 'completed' END AS state,
             -- half the operations in progress are held by a running attempt
             i % 100 = 1 AND (i / 100) % 2 = 0 AS held
      FROM generate_series(1, 100000) AS i) AS o;

-- every awaiting operation's approval; the older half past its expiry
INSERT INTO idempotency_approvals (list_seq, approval_id, account_id, operation_id, idempotency_key, route,
    fingerprint, summary, requested_by, created_at, expires_at)
SELECT NULL, approval_id, account_id, operation_id, idempotency_key, route, fingerprint, '{}', 'agent',
       created_at, CASE WHEN created_at < now() - interval '4 days' THEN created_at + interval '1 day'
                        ELSE now() + interval '1 day' END
FROM idempotency_operations WHERE state = 'awaiting_approval' ORDER BY created_at;

-- an event for every fifth operation: delivered, but for a few pending, being
-- sent, or unknown
INSERT INTO idempotency_outbox (event_id, account_id, operation_id, idempotency_key, fingerprint, route, kind,
    payload, external_key, state, deliveries, lease_token, next_attempt_at, created_at, updated_at)
SELECT 'evt-' || n, account_id, operation_id, idempotency_key, fingerprint, route, 'rollout', '{}', 'ext-' || n,
       event_state, CASE WHEN event_state = 'pending' THEN 0 ELSE 1 END,
       CASE WHEN event_state = 'sending' THEN 'lease-' || n END,
       CASE WHEN event_state = 'delivered' THEN created_at ELSE now() - (n % 60) * interval '1 second' END,
       created_at, created_at
FROM (SELECT o.*, row_number() OVER (ORDER BY created_at) AS n,
             CASE WHEN o.state = 'unknown' THEN 'unknown'
                  WHEN o.state = 'in_progress' AND o.lease_token IS NULL THEN 'sending'
                  WHEN o.created_at > now() - interval '2 hours' THEN 'pending'
                  ELSE 'delivered' END AS event_state
      FROM idempotency_operations o
      WHERE substr(md5(o.idempotency_key), 1, 1) IN ('0', '1', '2') AND o.state <> 'awaiting_approval') AS e;

-- the journal's inbox with two rounds' worth waiting
INSERT INTO audit_inbox (account_id, principal_id, operation_id, idempotency_key, fingerprint, route, event, at)
SELECT account_id, principal_id, operation_id, idempotency_key, fingerprint, route, 'completed', updated_at
FROM idempotency_operations ORDER BY created_at DESC LIMIT 10000;

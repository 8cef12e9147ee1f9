-- The statements that reach across accounts, as the code writes them, each
-- with EXPLAIN (ANALYZE, BUFFERS); writes roll back, so every plan sees the
-- same data. `partitioned` (psql variable) picks the statement text the code
-- had for the old schema where it changed.
\set QUIET on
\pset pager off
SELECT 'op_' || lpad(to_hex((extract(epoch FROM now() - interval '9 days 5 hours') * 1000)::bigint), 12, '0')
       || '70000000000000000000' AS reaper_first_id,
       now() - interval '9 days 5 hours' AS reaper_cutoff \gset

\echo '### chainer: a round takes the oldest 5,000 inbox records (journal::chainer)'
BEGIN;
\if :partitioned
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) DELETE FROM audit_inbox
 WHERE (account_id, id) IN (SELECT account_id, id FROM audit_inbox ORDER BY id LIMIT 5000)
 RETURNING id, account_id, principal_id, operation_id, idempotency_key, fingerprint, route,
           event, external_ref, at, attempt, resource_type, resource_id, state, evidence;
\else
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) DELETE FROM audit_inbox
 WHERE id IN (SELECT id FROM audit_inbox ORDER BY id LIMIT 5000)
 RETURNING id, account_id, principal_id, operation_id, idempotency_key, fingerprint, route,
           event, external_ref, at, attempt, resource_type, resource_id, state, evidence;
\endif
ROLLBACK;

\echo '### chainer: whether the inbox holds anything, and its first and last ids'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT id FROM audit_inbox ORDER BY id LIMIT 1;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT (SELECT MIN(id) FROM audit_inbox), (SELECT MAX(id) FROM audit_inbox);

\echo '### outbox worker: takes 16 due pending events (idempotency::outbox)'
BEGIN;
\if :partitioned
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
UPDATE idempotency_outbox SET state = 'sending', deliveries = deliveries + 1, lease_token = 'w',
       next_attempt_at = now() + interval '30 seconds', updated_at = now()
 WHERE state IN ('pending') AND next_attempt_at <= now()
   AND (account_id, seq) IN (SELECT account_id, seq FROM idempotency_outbox
                             WHERE state IN ('pending') AND next_attempt_at <= now()
                               AND (state = 'pending' OR state = 'sending' OR state = 'unknown')
                             ORDER BY next_attempt_at LIMIT 16 FOR UPDATE SKIP LOCKED)
 RETURNING event_id;
\else
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
UPDATE idempotency_outbox SET state = 'sending', deliveries = deliveries + 1, lease_token = 'w',
       next_attempt_at = now() + interval '30 seconds', updated_at = now()
 WHERE state IN ('pending') AND next_attempt_at <= now()
   AND seq IN (SELECT seq FROM idempotency_outbox
               WHERE state IN ('pending') AND next_attempt_at <= now()
                 AND (state = 'pending' OR state = 'sending' OR state = 'unknown')
               ORDER BY next_attempt_at LIMIT 16 FOR UPDATE SKIP LOCKED)
 RETURNING event_id;
\endif
ROLLBACK;

\echo '### outbox reconciler: takes 16 due events being sent or unknown'
BEGIN;
\if :partitioned
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
UPDATE idempotency_outbox SET lease_token = 'r', next_attempt_at = now() + interval '30 seconds', updated_at = now()
 WHERE state IN ('sending', 'unknown') AND next_attempt_at <= now()
   AND (account_id, seq) IN (SELECT account_id, seq FROM idempotency_outbox
                             WHERE state IN ('sending', 'unknown') AND next_attempt_at <= now()
                               AND (state = 'pending' OR state = 'sending' OR state = 'unknown')
                             ORDER BY next_attempt_at LIMIT 16 FOR UPDATE SKIP LOCKED)
 RETURNING event_id;
\else
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
UPDATE idempotency_outbox SET lease_token = 'r', next_attempt_at = now() + interval '30 seconds', updated_at = now()
 WHERE state IN ('sending', 'unknown') AND next_attempt_at <= now()
   AND seq IN (SELECT seq FROM idempotency_outbox
               WHERE state IN ('sending', 'unknown') AND next_attempt_at <= now()
                 AND (state = 'pending' OR state = 'sending' OR state = 'unknown')
               ORDER BY next_attempt_at LIMIT 16 FOR UPDATE SKIP LOCKED)
 RETURNING event_id;
\endif
ROLLBACK;

\echo '### retention reaper: finished operations past the cutoff, with their events and approvals (idempotency::store)'
BEGIN;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) DELETE FROM idempotency_operations
 WHERE operation_id < :'reaper_first_id' AND state IN ('completed', 'failed', 'rejected')
   AND updated_at < :'reaper_cutoff';
ROLLBACK;

\echo '### approvals reaper: up to 500 approvals past their expiry whose operation still waits (idempotency::approval)'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT a.* FROM idempotency_approvals a
  JOIN idempotency_operations o ON o.account_id = a.account_id AND o.operation_id = a.operation_id
 WHERE o.state = 'awaiting_approval' AND a.expires_at <= now()
   AND (a.decision IS NULL OR a.decision = 'approved')
 ORDER BY a.seq LIMIT 500;

\echo '### gauges (idempotency::gauges, the outbox and approvals extensions)'
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT state, COUNT(*) FROM idempotency_operations
 WHERE state = 'in_progress' OR state = 'awaiting_approval' OR state = 'unknown' GROUP BY state;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT MIN(updated_at) FROM idempotency_operations WHERE state = 'unknown';
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT state, COUNT(*) FROM idempotency_outbox
 WHERE state IN ('pending', 'sending', 'unknown', 'dead') GROUP BY state;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT MIN(created_at) FROM idempotency_outbox WHERE state = 'pending';
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT COUNT(*) FROM audit_inbox;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
SELECT CASE WHEN decision IS NOT NULL THEN decision WHEN expires_at <= now() THEN 'expired' ELSE 'pending' END, COUNT(*)
  FROM idempotency_approvals GROUP BY 1;

\echo '### for contrast, one account: a claim''s lookup as a prepared statement''s generic plan (idempotency::store)'
SET plan_cache_mode = force_generic_plan;
PREPARE lookup(text, text) AS
SELECT * FROM idempotency_operations WHERE account_id = $1 AND idempotency_key = $2;
EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE lookup('acct_7', 'key-5007');

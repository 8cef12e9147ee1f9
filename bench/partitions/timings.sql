-- Each cross-account statement run 50 times, each run rolled back, and the
-- median time of a run: steadier than one EXPLAIN ANALYZE on a busy machine.
\set QUIET on
\pset pager off
SELECT 'op_' || lpad(to_hex((extract(epoch FROM now() - interval '9 days 5 hours') * 1000)::bigint), 12, '0')
       || '70000000000000000000' AS reaper_first_id,
       now() - interval '9 days 5 hours' AS reaper_cutoff \gset

-- `statement` run `runs` times, each run rolled back: the median of a run in
-- ms, planned each time (PostgreSQL's default for a statement on a partitioned
-- table) and planned once (the services' generic plans, docs/design.md §13)
CREATE FUNCTION pg_temp.median_ms(statement text, runs int DEFAULT 50) RETURNS TABLE (planned_each_time numeric, planned_once numeric)
LANGUAGE plpgsql AS $$
DECLARE
    each_time numeric[] := '{}';
    once numeric[] := '{}';
    started timestamptz;
BEGIN
    EXECUTE 'DEALLOCATE ALL';
    EXECUTE 'PREPARE measured AS ' || statement;
    FOR i IN 1..runs LOOP
        started := clock_timestamp();
        BEGIN
            EXECUTE statement;
            RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = 'undo';
        EXCEPTION WHEN raise_exception THEN
            each_time := each_time || extract(epoch FROM clock_timestamp() - started) * 1000;
        END;
        started := clock_timestamp();
        BEGIN
            EXECUTE 'EXECUTE measured';
            RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = 'undo';
        EXCEPTION WHEN raise_exception THEN
            once := once || extract(epoch FROM clock_timestamp() - started) * 1000;
        END;
    END LOOP;
    RETURN QUERY SELECT
        round((SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY t) FROM unnest(each_time) t)::numeric, 3),
        round((SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY t) FROM unnest(once) t)::numeric, 3);
END;
$$;

\if :partitioned
\set round 'DELETE FROM audit_inbox WHERE (account_id, id) IN (SELECT account_id, id FROM audit_inbox ORDER BY id LIMIT 5000) RETURNING *'
\set worker 'UPDATE idempotency_outbox SET state = ''sending'', deliveries = deliveries + 1, lease_token = ''w'', next_attempt_at = now() + interval ''30 seconds'', updated_at = now() WHERE state IN (''pending'') AND next_attempt_at <= now() AND (account_id, seq) IN (SELECT account_id, seq FROM idempotency_outbox WHERE state IN (''pending'') AND next_attempt_at <= now() AND (state = ''pending'' OR state = ''sending'' OR state = ''unknown'') ORDER BY next_attempt_at LIMIT 16 FOR UPDATE SKIP LOCKED) RETURNING *'
\set reconciler 'UPDATE idempotency_outbox SET lease_token = ''r'', next_attempt_at = now() + interval ''30 seconds'', updated_at = now() WHERE state IN (''sending'', ''unknown'') AND next_attempt_at <= now() AND (account_id, seq) IN (SELECT account_id, seq FROM idempotency_outbox WHERE state IN (''sending'', ''unknown'') AND next_attempt_at <= now() AND (state = ''pending'' OR state = ''sending'' OR state = ''unknown'') ORDER BY next_attempt_at LIMIT 16 FOR UPDATE SKIP LOCKED) RETURNING *'
\else
\set round 'DELETE FROM audit_inbox WHERE id IN (SELECT id FROM audit_inbox ORDER BY id LIMIT 5000) RETURNING *'
\set worker 'UPDATE idempotency_outbox SET state = ''sending'', deliveries = deliveries + 1, lease_token = ''w'', next_attempt_at = now() + interval ''30 seconds'', updated_at = now() WHERE state IN (''pending'') AND next_attempt_at <= now() AND seq IN (SELECT seq FROM idempotency_outbox WHERE state IN (''pending'') AND next_attempt_at <= now() AND (state = ''pending'' OR state = ''sending'' OR state = ''unknown'') ORDER BY next_attempt_at LIMIT 16 FOR UPDATE SKIP LOCKED) RETURNING *'
\set reconciler 'UPDATE idempotency_outbox SET lease_token = ''r'', next_attempt_at = now() + interval ''30 seconds'', updated_at = now() WHERE state IN (''sending'', ''unknown'') AND next_attempt_at <= now() AND seq IN (SELECT seq FROM idempotency_outbox WHERE state IN (''sending'', ''unknown'') AND next_attempt_at <= now() AND (state = ''pending'' OR state = ''sending'' OR state = ''unknown'') ORDER BY next_attempt_at LIMIT 16 FOR UPDATE SKIP LOCKED) RETURNING *'
\endif
\set reaper 'DELETE FROM idempotency_operations WHERE operation_id < ''' :reaper_first_id ''' AND state IN (''completed'', ''failed'', ''rejected'') AND updated_at < ''' :reaper_cutoff ''''
\set expiry 'SELECT a.* FROM idempotency_approvals a JOIN idempotency_operations o ON o.account_id = a.account_id AND o.operation_id = a.operation_id WHERE o.state = ''awaiting_approval'' AND a.expires_at <= now() AND (a.decision IS NULL OR a.decision = ''approved'') ORDER BY a.seq LIMIT 500'

SET plan_cache_mode = force_generic_plan;
SELECT what, m.* FROM (VALUES
    ('chainer round (5,000 records)', :'round'),
    ('inbox has records', 'SELECT id FROM audit_inbox ORDER BY id LIMIT 1'),
    ('inbox first and last ids', 'SELECT (SELECT MIN(id) FROM audit_inbox), (SELECT MAX(id) FROM audit_inbox)'),
    ('outbox worker (16 due)', :'worker'),
    ('outbox reconciler (16 due)', :'reconciler'),
    ('retention reaper', :'reaper'),
    ('approvals expiry (500)', :'expiry'),
    ('gauge: operations unfinished', 'SELECT state, COUNT(*) FROM idempotency_operations WHERE state = ''in_progress'' OR state = ''awaiting_approval'' OR state = ''unknown'' GROUP BY state'),
    ('gauge: oldest unknown', 'SELECT MIN(updated_at) FROM idempotency_operations WHERE state = ''unknown'''),
    ('gauge: outbox events', 'SELECT state, COUNT(*) FROM idempotency_outbox WHERE state IN (''pending'', ''sending'', ''unknown'', ''dead'') GROUP BY state'),
    ('gauge: oldest pending', 'SELECT MIN(created_at) FROM idempotency_outbox WHERE state = ''pending'''),
    ('gauge: journal backlog', 'SELECT COUNT(*) FROM audit_inbox'),
    ('gauge: approvals', 'SELECT CASE WHEN decision IS NOT NULL THEN decision WHEN expires_at <= now() THEN ''expired'' ELSE ''pending'' END, COUNT(*) FROM idempotency_approvals GROUP BY 1'),
    ('one account: a claim''s lookup', 'SELECT * FROM idempotency_operations WHERE account_id = ''acct_7'' AND idempotency_key = ''key-5007''')
) AS s (what, statement), pg_temp.median_ms(statement) AS m;

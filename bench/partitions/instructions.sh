#!/usr/bin/env bash
# What a create's claim costs PostgreSQL in instructions, a count that does not
# move with the machine's load: the claim with its journal record (one
# statement, a writable CTE whose entry goes in only if the claim did, as the
# service sends it) on the schema before the partitions and after, with
# ON CONFLICT and without, each committed on its own with generic plans. Each
# is run 200 and 1,200 times by a stand-alone backend under callgrind, and the
# difference over 1,000 is printed.
#
#   sudo bench/partitions/instructions.sh
#
# Runs as root (the backend runs as postgres): it makes a cluster of its own,
# `callgrind` on port 5499, fills it with explain.sh's two databases, and
# drops it at the end. Needs valgrind.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cluster=callgrind port=5499
data=/var/lib/postgresql/15/$cluster
if pg_lsclusters -h | awk '{ print $1 "/" $2 }' | grep -qx "15/$cluster"; then
    echo "a cluster 15/$cluster exists already: drop it first (pg_dropcluster --stop 15 $cluster)" >&2
    exit 1
fi
work=$(mktemp -d) && chown postgres "$work"
trap 'pg_dropcluster --stop 15 $cluster 2>/dev/null || true; rm -rf "$work"' EXIT

pg_createcluster 15 $cluster -p $port -- --auth=trust >/dev/null
pg_ctlcluster --skip-systemctl-redirect 15 $cluster start
bash "$here/explain.sh" "postgres://postgres@127.0.0.1:$port/postgres" >"$work/explain.log" 2>&1 ||
    { cat "$work/explain.log" >&2; exit 1; }
pg_ctlcluster --skip-systemctl-redirect 15 $cluster stop

loop() { # times, ON CONFLICT clause or nothing
    local conflict=${2:+ON CONFLICT (account_id, idempotency_key) DO NOTHING}
    cat <<SQL
SET plan_cache_mode = force_generic_plan;
SET synchronous_commit = off;
DO \$\$ DECLARE account text; key text; BEGIN FOR i IN 1..$1 LOOP account := 'acct_' || (i % 1000); key := md5(i::text || clock_timestamp()::text); WITH claimed AS (INSERT INTO idempotency_operations (account_id, idempotency_key, operation_id, principal_id, method, route, fingerprint, state, response_status, response_body, created_at, updated_at) VALUES (account, key, 'op_' || key, 'agent', 'POST', '/v1/things', repeat('a', 64), 'completed', 201, '\x7b7d', now(), now()) $conflict RETURNING 1) INSERT INTO audit_inbox (account_id, principal_id, event, at) SELECT account, 'agent', 'completed', now() WHERE EXISTS (SELECT 1 FROM claimed); COMMIT; END LOOP; END \$\$;
SQL
}

instructions() { # database, times, clause
    loop "$2" "$3" >"$work/loop.sql"
    su postgres -c "valgrind --tool=callgrind --callgrind-out-file=$work/out \
        /usr/lib/postgresql/15/bin/postgres --single -D $data \
        -c config_file=/etc/postgresql/15/$cluster/postgresql.conf $1 <$work/loop.sql" >"$work/log" 2>&1 ||
        { cat "$work/log" >&2; return 1; }
    if grep -Eq 'ERROR|FATAL|PANIC' "$work/log"; then cat "$work/log" >&2; return 1; fi
    awk '/^(summary|totals):/ { print $2; exit }' "$work/out"
}

for schema in before after; do
    for clause in "ON CONFLICT" ""; do
        few=$(instructions "retrysafe_plans_$schema" 200 "$clause")
        many=$(instructions "retrysafe_plans_$schema" 1200 "$clause")
        echo "$schema, ${clause:-plain insert}: $(((many - few) / 1000)) instructions a claim"
    done
done

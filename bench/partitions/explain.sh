#!/usr/bin/env bash
# Prints the plans of the statements that reach across accounts (docs/design.md
# §13) on the schema before the partitions and after, each database filled
# with the same data set (data.sql): 100,000 operations of 1,000 accounts;
# then each statement's median time (timings.sql).
#
#   bench/partitions/explain.sh [postgres://postgres@127.0.0.1:5432/postgres]
#
# It makes (and leaves, to look at again) two databases on that server:
# retrysafe_plans_before and retrysafe_plans_after. The second is upgraded
# in place by the partitioning migrations, whose time is printed too.
set -euo pipefail
server=${1:-postgres://postgres@127.0.0.1:5432/postgres}
here=$(cd "$(dirname "$0")" && pwd)
migrations=$here/../../migrations
psql_on() { psql "${server%/*}/$1" -X -q -v ON_ERROR_STOP=1 "${@:2}"; }

for schema in before after; do
    db=retrysafe_plans_$schema
    psql "$server" -X -q -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
    psql_on "$db" -f "$migrations/platform/postgres/0001_api_keys.sql" \
        -f "$migrations/idempotency/postgres/0002_idempotency.sql" -f "$here/data.sql"
    if [ "$schema" = after ]; then
        echo "## upgrading $db in place"
        psql_on "$db" -c '\timing on' -1 -f "$migrations/idempotency/postgres/0010_idempotency_by_account.sql" \
            -f "$migrations/idempotency/postgres/0014_walks_across_accounts_on_their_own_keys.sql" \
            | grep -E '^Time' | awk '{ total += $2 } END { printf "the migration took %.0f ms\n", total }'
    fi
    psql_on "$db" -c 'VACUUM ANALYZE'
    partitioned=$([ "$schema" = after ] && echo true || echo false)
    echo "## $schema"
    psql_on "$db" -v partitioned=$partitioned -f "$here/plans.sql"
    echo "## $schema: median of 50 runs"
    psql_on "$db" -v partitioned=$partitioned -f "$here/timings.sql"
done

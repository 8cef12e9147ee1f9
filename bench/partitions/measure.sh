#!/usr/bin/env bash
# What the partitioned shape costs one account's statements: pgbench runs a
# create's writes (claim.pgbench) and a lookup by key (lookup.pgbench) on the
# two databases explain.sh made, in turns, each as prepared statements the way
# sqlx sends them, and prints transactions a second. The lookup runs on the
# partitioned tables twice: with PostgreSQL's default plan cache, and with
# generic plans forced (docs/design.md §13 says why). Indicative only: the
# figures that count are the bench's (bench/RESULTS.md), on a quiet machine.
# Its claims add rows: run explain.sh again before reading plans.
#
#   bench/partitions/measure.sh [postgres://postgres@127.0.0.1:5432/postgres] [seconds] [rounds]
set -euo pipefail
server=${1:-postgres://postgres@127.0.0.1:5432/postgres}
seconds=${2:-10}
rounds=${3:-3}
here=$(cd "$(dirname "$0")" && pwd)
run() { # database, plan cache mode, script
    PGOPTIONS="-c plan_cache_mode=$2" pgbench "${server%/*}/retrysafe_plans_$1" -n -M prepared -c 1 \
        -T "$seconds" -f "$here/$3" 2>/dev/null | awk '/^tps/ { printf "%.0f", $3 }'
}
for round in $(seq "$rounds"); do
    echo "round $round, transactions/s:" \
        "claim before $(run before auto claim.pgbench), after $(run after auto claim.pgbench);" \
        "lookup before $(run before auto lookup.pgbench), after $(run after auto lookup.pgbench)," \
        "after with generic plans $(run after force_generic_plan lookup.pgbench)"
done

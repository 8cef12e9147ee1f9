#!/usr/bin/env bash
# Instructions one request costs the tickets service on SQLite, the layer on or
# off: the release binary runs under callgrind with its instrumentation off
# until 50 requests have warmed it, then counts N requests (sent by curl from
# outside, so the client is not counted) and dumps the profile. What a
# request makes the kernel do is not counted; everything in the process is:
# the handler, the layer, SQLite's thread, the journal's rounds.
#
#   create   a new ticket under a new key each time
#   replay   the same create again under one key, answered as a replay
#   healthz  GET /healthz, the least any request to the service costs
#
#   cargo build --release -p tickets          # or TICKETS_BIN=another/build/of/tickets
#   bench/profile/requests.sh create on 300      # or off
#   callgrind_annotate --inclusive=yes target/profile/create-on/callgrind.out.1 | less
#
# The log is off, as in the bench (RUST_LOG=off unless set): the text log is
# tens of thousands of instructions a request, none of them the layer's.
# Needs valgrind and curl; serves on 127.0.0.1:7301.
set -euo pipefail
kind=${1:?create, replay or healthz} mode=${2:?on or off} requests=${3:-300}
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${TICKETS_BIN:-$root/target/release/tickets}
dir=$root/target/profile/$kind-$mode
rm -rf "$dir" && mkdir -p "$dir"
RUST_LOG=${RUST_LOG:-off} RETRYSAFE_SANDBOX=true RETRYSAFE_DATA_DIR=$dir TICKETS_ADDR=127.0.0.1:7301 RETRYSAFE_IDEMPOTENCY=$mode \
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$dir/callgrind.out" \
    "$bin" >"$dir/log" 2>&1 &
service=$!
# waited for, so that the next run finds the port free
trap 'kill $service 2>/dev/null || true; wait $service 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf -o /dev/null http://127.0.0.1:7301/healthz && break; sleep 1; done
create() {
    curl -sf -o /dev/null -X POST http://127.0.0.1:7301/v1/tickets \
        -H 'Authorization: Bearer demo-acme-agent' -H 'Content-Type: application/json' \
        -H "Idempotency-Key: $1" -d "{\"project\":\"ops\",\"title\":\"ticket $1\",\"priority\":\"high\"}"
}
request() {
    case $kind in
    create) create "$1" ;;
    replay) create replayed ;;
    healthz) curl -sf -o /dev/null http://127.0.0.1:7301/healthz ;;
    *) echo "unknown kind: $kind" >&2 && exit 2 ;;
    esac
}
for i in $(seq 50); do request "warm-$i"; done
sleep 1
callgrind_control -i on $service >/dev/null 2>&1
for i in $(seq "$requests"); do request "counted-$i"; done
sleep 1 # the journal's round for the last requests
callgrind_control -d $service >/dev/null 2>&1
total=$(awk '/^summary:/ { print $2 }' "$dir/callgrind.out.1")
echo "$kind $mode: $((total / requests)) instructions a request ($requests requests; profile in $dir/callgrind.out.1)"

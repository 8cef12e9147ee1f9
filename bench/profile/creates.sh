#!/usr/bin/env bash
# Instructions a create costs the tickets service on SQLite, the layer on or
# off: the release binary runs under callgrind with its instrumentation off
# until 50 creates have warmed it, then counts N creates (sent by curl from
# outside, so the client is not counted) and dumps the profile. What a
# create makes the kernel do is not counted; everything in the process is:
# the handler, the layer, SQLite's thread, the journal's rounds.
#
#   cargo build --release -p tickets
#   bench/profile/creates.sh on 300      # or off
#   callgrind_annotate --inclusive=yes target/profile/on/callgrind.out.1 | less
#
# Needs valgrind and curl; serves on 127.0.0.1:7301.
set -euo pipefail
mode=${1:?on or off} creates=${2:-300}
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=$root/target/profile/$mode
rm -rf "$dir" && mkdir -p "$dir"
RETRYSAFE_SANDBOX=true RETRYSAFE_DATA_DIR=$dir TICKETS_ADDR=127.0.0.1:7301 RETRYSAFE_IDEMPOTENCY=$mode \
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$dir/callgrind.out" \
    "$root/target/release/tickets" >"$dir/log" 2>&1 &
service=$!
trap 'kill $service 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf -o /dev/null http://127.0.0.1:7301/healthz && break; sleep 1; done
create() {
    curl -sf -o /dev/null -X POST http://127.0.0.1:7301/v1/tickets \
        -H 'Authorization: Bearer demo-acme-agent' -H 'Content-Type: application/json' \
        -H "Idempotency-Key: $1" -d "{\"project\":\"ops\",\"title\":\"ticket $1\",\"priority\":\"high\"}"
}
for i in $(seq 50); do create "warm-$i"; done
sleep 1
callgrind_control -i on $service >/dev/null 2>&1
for i in $(seq "$creates"); do create "counted-$i"; done
sleep 1 # the journal's round for the last creates
callgrind_control -d $service >/dev/null 2>&1
total=$(awk '/^summary:/ { print $2 }' "$dir/callgrind.out.1")
echo "$mode: $((total / creates)) instructions a create ($creates creates; profile in $dir/callgrind.out.1)"

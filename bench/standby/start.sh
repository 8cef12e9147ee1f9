#!/usr/bin/env bash
# A PostgreSQL server for the bench, with no standby, or with a streaming
# standby that is asynchronous or synchronous: what each costs a create
# (docs/design.md §12). All three are made the same way, from the machine's
# PostgreSQL programs, so that only the standby differs. It prints the URL
# to give the bench, and stops both servers when it is stopped (Ctrl-C).
#
#   bench/standby/start.sh none|asynchronous|synchronous
#   TEST_DATABASE_URL=<printed URL> cargo run --release -p bench -- --backend postgres --creates-only
set -euo pipefail
mode=${1:?usage: bench/standby/start.sh none|asynchronous|synchronous}
case $mode in none|asynchronous|synchronous) ;; *) echo "none, asynchronous or synchronous" >&2; exit 2 ;; esac
bin=$(pg_config --bindir)
dir=$(mktemp -d /tmp/retrysafe-bench-pg-XXXXXX)
primary=55432 standby=55433
# initdb refuses root: as root, every PostgreSQL program runs as postgres
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres: "$dir"
stop() {
  for server in standby primary; do
    [ -d "$dir/$server" ] && as_postgres "$bin/pg_ctl" -D "$dir/$server" -m fast -w stop >/dev/null 2>&1 || true
  done
  rm -rf "$dir"
}
trap stop EXIT

as_postgres "$bin/initdb" --auth=trust --username=postgres --encoding=UTF8 -D "$dir/primary" >/dev/null
cat >>"$dir/primary/postgresql.auto.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $primary
unix_socket_directories = '$dir'
wal_level = replica
max_wal_senders = 4
max_connections = 200
CONF
as_postgres "$bin/pg_ctl" -w -D "$dir/primary" -l "$dir/primary.log" start >/dev/null
if [ "$mode" != none ]; then
  conninfo="host=127.0.0.1 port=$primary user=postgres application_name=standby"
  as_postgres "$bin/pg_basebackup" --write-recovery-conf --wal-method=stream --checkpoint=fast -d "$conninfo" -D "$dir/standby"
  cat >>"$dir/standby/postgresql.auto.conf" <<CONF
port = $standby
primary_conninfo = '$conninfo'
CONF
  as_postgres "$bin/pg_ctl" -w -D "$dir/standby" -l "$dir/standby.log" start >/dev/null
  until [ "$(as_postgres "$bin/psql" -XAt -h 127.0.0.1 -p $primary -U postgres -c \
      "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" = 1 ]; do sleep 0.1; done
  if [ "$mode" = synchronous ]; then
    # only once the standby streams: until then a commit would wait for it forever
    as_postgres "$bin/psql" -XAtq -h 127.0.0.1 -p $primary -U postgres \
      -c "ALTER SYSTEM SET synchronous_standby_names = 'standby'" -c "SELECT pg_reload_conf()" >/dev/null
  fi
fi
echo "TEST_DATABASE_URL=postgres://postgres@127.0.0.1:$primary/postgres   ($mode standby; Ctrl-C stops it)"
sleep infinity &
wait $!

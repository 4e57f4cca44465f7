#!/usr/bin/env bash
# Wake-ups and commits (docs/design-core.md, "Wake-ups"): pgbench, 10 clients, on a throwaway PostgreSQL with the
# server's defaults (fsync, synchronous_commit, full_page_writes on: the durable profile). Each script runs
# ROUNDS times for SECONDS seconds, interleaved, and the median tps is printed. create_task runs against two
# databases: "before" migrated by the build in BEFORE (a checkout of an older commit, e.g. the main checkout) and
# "after" by this checkout.
#   internal/bench/pgbench/run.sh [BEFORE_CHECKOUT]       (SECONDS=20 ROUNDS=3 CLIENTS=10 by default)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
before="${1:-}"
secs="${SECONDS_EACH:-20}"; rounds="${ROUNDS:-3}"; clients="${CLIENTS:-10}"
bin=/usr/lib/postgresql/15/bin
export PATH="$PATH:/usr/local/go/bin"
dir="$(mktemp -d /tmp/stepready-pgbench-XXXXXX)"
as=()
if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; as=(runuser -u postgres --); fi
port=$((20000 + RANDOM % 10000))
"${as[@]}" "$bin/initdb" -D "$dir/data" -U postgres -A trust >/dev/null
"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -o "-p $port -k $dir -c max_connections=100" -l "$dir/log" -w start >/dev/null
trap '"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1; rm -rf "$dir"' EXIT
url() { echo "postgres://postgres@localhost:$port/$1?sslmode=disable"; }
psql() { "$bin/psql" -q -h localhost -p "$port" -U postgres "$@"; }
psql -c "CREATE DATABASE plain" -c "CREATE DATABASE after" postgres
psql -c "CREATE TABLE bench_rows (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v int)" plain
(cd "$repo" && go run ./cmd/scheduler migrate up --database-url "$(url after)" >/dev/null 2>&1)
runs=("plain insert.sql" "plain insert_notify.sql" "plain insert_then_wake.sql" "after create_task.sql" "after create_task_wake.sql")
if [ -n "$before" ]; then
  psql -c "CREATE DATABASE before" postgres
  (cd "$before" && go run ./cmd/scheduler migrate up --database-url "$(url before)" >/dev/null 2>&1)
  runs+=("before create_task.sql")
fi
declare -A tps
for r in $(seq "$rounds"); do
  for run in "${runs[@]}"; do
    set -- $run
    t=$("$bin/pgbench" -n -h localhost -p "$port" -U postgres -c "$clients" -j 2 -T "$secs" -f "$here/$2" "$1" 2>/dev/null |
      awk '/^tps/ {print int($3)}')
    tps["$run"]+="$t "
  done
done
printf 'load average at the end: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
for run in "${runs[@]}"; do
  med=$(tr ' ' '\n' <<<"${tps[$run]}" | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  printf '%-32s median %6s tps  (runs: %s)\n' "$run" "$med" "${tps[$run]}"
done

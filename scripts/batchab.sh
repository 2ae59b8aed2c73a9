#!/usr/bin/env bash
# Batch reads on three scale-out nodes, two sets of node flags against
# each other on one seeded population: USERS users (default 1,000,000)
# are seeded over HTTP once, then ROUNDS rounds (default 2) start three
# fresh nodes with flags A, then with flags B, on the same Redis keys and
# PostgreSQL database, and read 1,000 random ids at a time for 20 s a run:
# node 1 with 8 clients (beside a plain Redis MGET of as many keys, the
# baseline of that moment), node 1 with one, node 2 with 8 and with one.
# Each run's output goes to OUT/ROUND-A|B/, with the nodes' replica
# metrics and RSS. WARM=1 reads for 20 s on nodes 1 and 2 before the
# measured runs (a bounded read replica starts empty).
#
#   scripts/batchab.sh OUT "FLAGS A" "FLAGS B"
#   e.g. scripts/batchab.sh /tmp/ab "-read-replica" ""
#
# Uses the Redis, PostgreSQL (trust auth) and NATS servers on their
# standard loopback ports, or REDIS_URL, PG_ADMIN_URL and NATS_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/batchab.sh OUT "FLAGS A" "FLAGS B"}
flags_a=${2?}
flags_b=${3?}
USERS=${USERS:-1000000}
ROUNDS=${ROUNDS:-2}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
PG_ADMIN_URL=${PG_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
KEY=bench-key-0123456789abcdef0123456789
SECRET=bench-secret-0123456789abcdef0123456789
mkdir -p "$out"

bin=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$bin"
}
trap cleanup EXIT
go build -o "$bin/presenced" ./cmd/presenced
go build -o "$bin/presence-bench" ./cmd/presence-bench
pb="$bin/presence-bench"
stamp=$(date +%s)
db="presenced_ab_$stamp"
psql "$PG_ADMIN_URL" -qc "CREATE DATABASE $db" >/dev/null
pg_url="${PG_ADMIN_URL%/*}/$db?sslmode=disable"
prefix="ab$stamp:"

# nodes DIR FLAGS…: three nodes on ports 18281–18283, ready.
nodes() {
	local dir=$1
	shift
	pids=()
	for i in 1 2 3; do
		# Nobody expires or turns away while the rounds run.
		# shellcheck disable=SC2068
		"$bin/presenced" -addr "127.0.0.1:1828$i" -data "$dir/data$i" -api-key "$KEY" -jwt-secret "$SECRET" \
			-log-level warn -dev -redis-url "$REDIS_URL" -redis-prefix "$prefix" -postgres-url "$pg_url" \
			-nats-url "$NATS_URL" -node-id "ab$i" -poll-interval 0 -heartbeat-ttl 3h -idle-after 4h $@ \
			>"$dir/node$i.log" 2>&1 &
		pids+=($!)
	done
	for i in 1 2 3; do
		for _ in $(seq 200); do
			curl -sf "http://127.0.0.1:1828$i/readyz" >/dev/null && break
			sleep 0.1
		done
	done
	sleep 3
}
stop() {
	for i in 1 2 3; do
		curl -sf -H "Authorization: Bearer $KEY" "http://127.0.0.1:1828$i/metrics" | grep -E '^presenced_replica' >"$1/metrics-node$i.txt" || true
		echo "node$i $(grep VmRSS "/proc/${pids[$((i - 1))]}/status")" >>"$1/rss.txt"
	done
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait "${pids[@]}" 2>/dev/null || true
	pids=()
}
read1() { # read1 DIR NAME PORT ARGS…
	local dir=$1 name=$2 port=$3
	shift 3
	"$pb" batch -url "http://127.0.0.1:$port" -api-key "$KEY" -users "$USERS" -seed=false -duration 20s "$@" >"$dir/$name.txt" 2>&1
	grep -E '^(GET|POST|MGET):' "$dir/$name.txt" | sed "s|^|$(basename "$dir") $name |"
}

mkdir -p "$out/seed"
nodes "$out/seed" $flags_a
"$pb" batch -url http://127.0.0.1:18281 -api-key "$KEY" -users "$USERS" -duration 1s >"$out/seed/seed.txt" 2>&1
grep -m1 '^seeded' "$out/seed/seed.txt"
stop "$out/seed"
for r in $(seq "$ROUNDS"); do
	for side in A B; do
		dir="$out/$r-$side"
		mkdir -p "$dir"
		if [ "$side" = A ]; then nodes "$dir" $flags_a; else nodes "$dir" $flags_b; fi
		echo "== round $r $side: $(uptime | sed 's/.*load/load/')"
		if [ -n "${WARM:-}" ]; then
			read1 "$dir" warm1 18281 >/dev/null
			read1 "$dir" warm2 18282 >/dev/null
		fi
		read1 "$dir" node1-c8 18281 -baseline-redis "$REDIS_URL"
		read1 "$dir" node1-c1 18281 -concurrency 1
		read1 "$dir" node2-c8 18282
		read1 "$dir" node2-c1 18282 -concurrency 1
		stop "$dir"
	done
done

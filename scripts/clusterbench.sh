#!/usr/bin/env bash
# Batch reads on three presenced nodes over a three-master Redis Cluster
# (started here, on ports 7101–7103, with redis-server from PATH; no
# replicas), with PostgreSQL (trust auth) and NATS on their standard
# loopback ports or PG_ADMIN_URL / NATS_URL. USERS users (default
# 1,000,000) are seeded over HTTP through node 1 and read through node 1
# (8 clients) and node 2 (1 client, then 8); each run's JSON goes to the
# out directory, with the nodes' RSS and each master's used_memory.
# WARM=1 reads through node 2 for 20 s before its measured runs.
#
#   [WARM=1] scripts/clusterbench.sh OUT-DIR [node flags…]     e.g. … /tmp/rc -read-replica
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/clusterbench.sh OUT-DIR [node flags…]}
shift
mkdir -p "$out"
USERS=${USERS:-1000000}
PG_ADMIN_URL=${PG_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
KEY=bench-key-0123456789abcdef0123456789
SECRET=bench-secret-0123456789abcdef0123456789
ports=(7101 7102 7103)

pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	for p in "${ports[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

for p in "${ports[@]}"; do
	rm -f "$out/redis-$p.conf"
	redis-server --port "$p" --bind 127.0.0.1 --cluster-enabled yes --cluster-config-file "redis-$p.conf" \
		--save '' --appendonly no --daemonize yes --dir "$out" --logfile "redis-$p.log"
done
sleep 1
redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >/dev/null
for _ in $(seq 100); do
	redis-cli -p 7101 cluster info | grep -q cluster_state:ok && break
	sleep 0.1
done

go build -o "$out/presenced" ./cmd/presenced
go build -o "$out/presence-bench" ./cmd/presence-bench
{
	echo "date: $(date -u +%FT%TZ)"
	echo "cpu: $(nproc) × $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
	echo "commit: $(git rev-parse --short HEAD)"
	echo "redis: $(redis-server --version)"
	echo "node flags: $*"
} | tee "$out/machine.txt"

db="presenced_rc_$(date +%s)"
psql "$PG_ADMIN_URL" -qc "CREATE DATABASE $db" >/dev/null
pg="${PG_ADMIN_URL%/*}/$db?sslmode=disable"
prefix="rc$(date +%s):"
for i in 1 2 3; do
	# Nobody expires or turns away while the reads run (see loadbench.sh).
	"$out/presenced" -addr "127.0.0.1:1828$i" -data "$out/data$i" -api-key "$KEY" -jwt-secret "$SECRET" -log-level warn -dev \
		-redis-url redis://127.0.0.1:7101 -redis-prefix "$prefix" -postgres-url "$pg" -nats-url "$NATS_URL" -node-id "rc$i" \
		-poll-interval 0 -heartbeat-ttl 20m -idle-after 1h "$@" >"$out/node$i.log" 2>&1 &
	pids+=($!)
done
for i in 1 2 3; do
	for _ in $(seq 200); do
		curl -sf "http://127.0.0.1:1828$i/readyz" >/dev/null && break
		sleep 0.1
	done
done
pb="$out/presence-bench"
$pb batch -url http://127.0.0.1:18281 -api-key "$KEY" -users "$USERS" -duration 20s -json >"$out/node1-c8.json"
if [ -n "${WARM:-}" ]; then
	# The seed's changes fill node 2's replica with statuses only: a
	# user's first full view there reads the Cluster. Read for 20 s first.
	$pb batch -url http://127.0.0.1:18282 -api-key "$KEY" -users "$USERS" -seed=false -duration 20s -json >"$out/node2-warm.json"
fi
$pb batch -url http://127.0.0.1:18282 -api-key "$KEY" -users "$USERS" -seed=false -concurrency 1 -duration 20s -json >"$out/node2-c1.json"
$pb batch -url http://127.0.0.1:18282 -api-key "$KEY" -users "$USERS" -seed=false -duration 20s -json >"$out/node2-c8.json"
for p in "${pids[@]}"; do echo "node pid $p: rss $(ps -o rss= -p "$p") KiB"; done | tee -a "$out/machine.txt"
for p in "${ports[@]}"; do echo "redis $p: $(redis-cli -p "$p" info memory | grep '^used_memory:' | tr -d '\r')"; done | tee -a "$out/machine.txt"

#!/usr/bin/env bash
# Runs every presence-bench scenario against presenced on this machine —
# one embedded node, then three (and, for the connection count, six)
# scale-out nodes sharing one Redis, PostgreSQL and NATS — and writes the
# JSON results and the human tables of docs/benchmarks.md (its plots are
# drawn from docs/img/*.json: see "The plots" there).
#
#   scripts/loadbench.sh [out-dir]          (default: a new directory under /tmp)
#
# The scale-out half uses the Redis, PostgreSQL (trust auth) and NATS
# JetStream servers on their standard loopback ports, or REDIS_URL,
# PG_ADMIN_URL (a database the script may CREATE DATABASE from) and
# NATS_URL. It creates a fresh database and Redis key prefix per run.
# SCENARIOS (default "all") picks a subset: e.g. SCENARIOS="fanout churn"
# ("rooms" is rooms, room-count and room-memory on the embedded node, and
# STORM_FLAGS are added to the storm's command (e.g. -known=false: the
# re-subscribes ask for the whole snapshot, as before the clients sent
# the versions they hold).
# ROOMS_ROUNDS rounds of rooms (default 3) and one of room-interval on
# three nodes sharing a private Redis: its own redis-server on
# ROOMS_REDIS_PORT, default 6390, started and stopped here; "storm"
# kills one of three nodes on such a Redis while others change status);
# MODES (default "embedded cluster") one of the two halves. CLUSTER_USERS
# (default 200000) is the population of the scale-out batch read.
# The whole run takes about 30 minutes; e.g. MODES=cluster SCENARIOS=rooms
# about 6. Each run's load average at its start and end is in NAME.load
# (with the rooms' Redis CPU over the run).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-$(mktemp -d /tmp/presenced-loadbench-XXXXXX)}
mkdir -p "$out"
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
PG_ADMIN_URL=${PG_ADMIN_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
SCENARIOS=${SCENARIOS:-all}
MODES=${MODES:-embedded cluster}
CLUSTER_USERS=${CLUSTER_USERS:-200000}
ROOMS_ROUNDS=${ROOMS_ROUNDS:-3}
ROOMS_REDIS_PORT=${ROOMS_REDIS_PORT:-6390}
KEY=bench-key-0123456789abcdef0123456789
SECRET=bench-secret-0123456789abcdef0123456789

bin=$(mktemp -d)
pids=()
redis_pid=
cleanup() {
	for p in "${pids[@]}" $redis_pid; do kill -TERM "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$bin"
}
trap cleanup EXIT
go build -o "$bin/presenced" ./cmd/presenced
go build -o "$bin/presence-bench" ./cmd/presence-bench
pb="$bin/presence-bench"

{
	echo "date: $(date -u +%FT%TZ)"
	echo "go: $(go version)"
	echo "cpu: $(nproc) × $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
	echo "memory: $(free -g | awk '/Mem:/ {print $2}') GiB"
	echo "commit: $(git rev-parse --short HEAD)"
	echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/machine.txt"

want() { [[ " $MODES " == *" $mode "* ]] && [[ $SCENARIOS == all || " $SCENARIOS " == *" $1 "* ]]; }

# node NAME PORT ARGS… starts presenced on 127.0.0.1:PORT and waits for it.
node() {
	local name=$1 port=$2
	shift 2
	"$bin/presenced" -addr "127.0.0.1:$port" -data "$out/data-$name" -api-key "$KEY" -jwt-secret "$SECRET" \
		-log-level warn "$@" >"$out/$name.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 200); do
		curl -sf "http://127.0.0.1:$port/readyz" >/dev/null && return 0
		sleep 0.1
	done
	echo "node $name did not start; its log:" >&2
	cat "$out/$name.log" >&2
	exit 1
}

stop_nodes() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done # the nodes only: not the rooms' Redis
	pids=()
}

# cpu_ticks PID: the user and system CPU of PID so far, in 1/100 s (0 without a PID).
cpu_ticks() {
	if [[ -z ${1:-} ]]; then echo 0; else awk '{print $14 + $15}' "/proc/$1/stat"; fi
}

# run NAME ARGS… runs one scenario: the table on the terminal and in
# NAME.txt, the JSON in NAME.json.
run() {
	local name=$1
	shift
	echo
	echo "== $name: presence-bench $*"
	echo "$(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$out/$name.load"
	local t0=$SECONDS r0
	r0=$(cpu_ticks "$redis_pid")
	"$pb" "$@" -json >"$out/$name.json" 2>"$out/$name.progress"
	echo "$(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg) (the end)" | tee -a "$out/$name.load"
	if [[ -n $redis_pid ]]; then # the rooms' private Redis: its CPU over the whole run, setup included
		echo "redis: $((($(cpu_ticks "$redis_pid") - r0) * 10)) ms of CPU in $((SECONDS - t0)) s" | tee -a "$out/$name.load"
	fi
	python3 -m json.tool "$out/$name.json" >"$out/$name.txt" 2>/dev/null || cp "$out/$name.json" "$out/$name.txt"
	cat "$out/$name.txt"
}

# --- embedded: one node, nothing else ---
mode=embedded

if want heartbeats; then
	node embedded 18180 -dev
	run embedded-heartbeats-ws heartbeats -url ws://127.0.0.1:18180 -dev -api-key "$KEY" -n 10000 -interval 100ms -duration 20s -baseline-redis "$REDIS_URL"
	run embedded-heartbeats-http heartbeats -url http://127.0.0.1:18180 -transport http -api-key "$KEY" -n 20000 -interval 200ms -duration 20s
	stop_nodes
fi
if want batch; then
	node embedded 18180 -dev -poll-interval 0 -heartbeat-ttl 20m -idle-after 1h # reads of a settled population (see below)
	run embedded-batch batch -url http://127.0.0.1:18180 -api-key "$KEY" -users 1000000 -duration 20s -baseline-redis "$REDIS_URL"
	# latency without queueing: one read in flight
	run embedded-batch-c1 batch -url http://127.0.0.1:18180 -api-key "$KEY" -users 1000000 -seed=false -concurrency 1 -duration 20s
	stop_nodes
fi
if want fanout; then
	node embedded 18180 -dev
	run embedded-fanout-1 fanout -url ws://127.0.0.1:18180 -dev -watchers 500 -targets 1 -duration 20s -baseline-redis "$REDIS_URL"
	run embedded-fanout-10 fanout -url ws://127.0.0.1:18180 -dev -watchers 500 -targets 10 -duration 20s
	stop_nodes
fi
if want churn; then
	node embedded 18180 -dev -heartbeat-ttl 5s
	run embedded-churn churn -url ws://127.0.0.1:18180 -dev -devices 2000 -duration 60s
	stop_nodes
fi
if want rooms; then # rooms exist on the embedded node only
	node embedded 18180 -dev
	run embedded-rooms rooms -url ws://127.0.0.1:18180 -dev -api-key "$KEY" -watchers 500 -movers 10 -interval 100ms -duration 20s
	stop_nodes
	node rooms-count 18180 -dev -heartbeat-ttl 10m
	run embedded-room-count room-count -url http://127.0.0.1:18180 -api-key "$KEY" -members 100000
	stop_nodes
	node rooms-memory 18180 -dev -heartbeat-ttl 10m -pprof-addr 127.0.0.1:18160 # a fresh node: memory before anything
	run embedded-room-memory room-memory -url http://127.0.0.1:18180 -api-key "$KEY" -users 100000 -memberships-per-user 10 -rooms 10000 -pprof-url http://127.0.0.1:18160
	stop_nodes
fi
if want connections; then
	for n in 5000 10000 15000; do
		node embedded 18180 -dev
		run "embedded-connections-$n" connections -url ws://127.0.0.1:18180 -dev -api-key "$KEY" -n "$n"
		stop_nodes
	done
fi
if want limits; then
	run limits limits -redis "${REDIS_URL#redis://}"
fi

# --- scale-out: nodes on Redis + PostgreSQL + NATS ---
mode=cluster

db="presenced_bench_$(date +%s)"
psql "$PG_ADMIN_URL" -qc "CREATE DATABASE $db" >/dev/null
pg_url="${PG_ADMIN_URL%/*}/$db?sslmode=disable"
prefix="bench$(date +%s):"
cluster_redis=$REDIS_URL
# own_redis NAME starts a redis-server of the scale-out nodes' own on
# ROOMS_REDIS_PORT (nothing else's keys or commands in it), for the
# next cluster; own_redis_stop stops it.
own_redis() {
	redis-server --port "$ROOMS_REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$out" \
		--logfile "redis-$1.log" &
	redis_pid=$!
	for _ in $(seq 100); do
		redis-cli -p "$ROOMS_REDIS_PORT" ping 2>/dev/null | grep -q PONG && break
		sleep 0.1
	done
	redis-cli -p "$ROOMS_REDIS_PORT" info server | grep -m1 redis_version | tr -d '\r' | sed "s/^/$1 /" | tee -a "$out/machine.txt"
	cluster_redis="redis://127.0.0.1:$ROOMS_REDIS_PORT/0"
}
own_redis_stop() {
	kill -TERM "$redis_pid" 2>/dev/null || true
	wait "$redis_pid" 2>/dev/null || true
	redis_pid=
	cluster_redis=$REDIS_URL
}
cluster() { # cluster N ARGS…: N nodes on ports 18181… on $cluster_redis
	local n=$1
	shift
	for i in $(seq "$n"); do
		node "node$i" $((18180 + i)) -dev -redis-url "$cluster_redis" -redis-prefix "$prefix" -postgres-url "$pg_url" \
			-nats-url "$NATS_URL" -node-id "bench$i" "$@"
	done
}

if want heartbeats; then
	cluster 3
	run cluster-heartbeats-ws heartbeats -url ws://127.0.0.1:18181 -dev -api-key "$KEY" -n 10000 -interval 100ms -duration 20s -baseline-redis "$REDIS_URL"
	# the baseline as a client with a small connection pool does it (go-redis
	# defaults to 10 per core: 20 here), one round trip per beat
	run cluster-heartbeats-ws-pool20 heartbeats -url ws://127.0.0.1:18181 -dev -api-key "$KEY" -n 10000 -interval 100ms -duration 20s -baseline-redis "$REDIS_URL" -baseline-conns 20
	stop_nodes
fi
if want batch; then
	# Nobody expires or turns away while the reads run: seeding a million
	# users takes ~5 min, and their idle times would all come due at once.
	# BATCH_FLAGS adds flags to these nodes (e.g. -read-replica). The
	# population is seeded through node 1; the last two runs read on node 2,
	# which learnt of every user from Redis or over the bus.
	# shellcheck disable=SC2086
	cluster 3 -poll-interval 0 -heartbeat-ttl 20m -idle-after 1h ${BATCH_FLAGS:-}
	run cluster-batch batch -url http://127.0.0.1:18181 -api-key "$KEY" -users "$CLUSTER_USERS" -duration 20s -baseline-redis "$REDIS_URL"
	run cluster-batch-c1 batch -url http://127.0.0.1:18181 -api-key "$KEY" -users "$CLUSTER_USERS" -seed=false -concurrency 1 -duration 20s
	run cluster-batch-node2 batch -url http://127.0.0.1:18182 -api-key "$KEY" -users "$CLUSTER_USERS" -seed=false -duration 20s
	run cluster-batch-node2-c1 batch -url http://127.0.0.1:18182 -api-key "$KEY" -users "$CLUSTER_USERS" -seed=false -concurrency 1 -duration 20s
	stop_nodes
fi
if want fanout; then
	cluster 3
	run cluster-fanout-1 fanout -url ws://127.0.0.1:18181 -url ws://127.0.0.1:18182,ws://127.0.0.1:18183 -dev -watchers 500 -targets 1 -duration 20s -baseline-redis "$REDIS_URL"
	run cluster-fanout-10 fanout -url ws://127.0.0.1:18181 -url ws://127.0.0.1:18182,ws://127.0.0.1:18183 -dev -watchers 500 -targets 10 -duration 20s
	stop_nodes
fi
if want churn; then
	cluster 3 -heartbeat-ttl 5s
	run cluster-churn churn -url ws://127.0.0.1:18181 -url ws://127.0.0.1:18182,ws://127.0.0.1:18183 -dev -devices 2000 -duration 60s
	stop_nodes
fi
if want rooms; then
	# Rooms on three nodes sharing a Redis of their own (nothing else's
	# keys or commands in it): the movers, status users and the HTTP drive
	# on node 1, the watchers on nodes 2 and 3. Fresh nodes per run.
	own_redis rooms
	urls=(-url ws://127.0.0.1:18181 -url "ws://127.0.0.1:18182,ws://127.0.0.1:18183")
	for r in $(seq "$ROOMS_ROUNDS"); do
		cluster 3
		run "cluster-rooms-$r" rooms "${urls[@]}" -dev -api-key "$KEY" -watchers 500 -movers 10 -interval 100ms -duration 20s
		stop_nodes
	done
	cluster 3 -heartbeat-ttl 10m # the seeded members stay online through the run
	run cluster-room-interval room-interval "${urls[@]}" -dev -api-key "$KEY" -members 100000 -watchers 500 -rate 100 -duration 30s
	stop_nodes
	own_redis_stop
fi
if want storm; then
	# A reconnect storm: three nodes on a Redis of their own, 3,000
	# sockets on each watching 50 users; after 10 s the tool SIGKILLs
	# node 3 and its sockets reconnect to nodes 1 and 2 while 20 other
	# users change status over HTTP there (presence-bench storm).
	own_redis storm
	cluster 3
	run cluster-storm storm -url ws://127.0.0.1:18181,ws://127.0.0.1:18182,ws://127.0.0.1:18183 -dev -api-key "$KEY" \
		-per-node 3000 -subs 50 -probes 20 ${STORM_FLAGS:-}
	stop_nodes
	own_redis_stop
fi
if want connections; then
	# 100,000 connections held at once: six nodes (a process may hold
	# 20,000 files here), ~16,700 each, measured in parallel.
	cluster 6
	tools=()
	for i in $(seq 6); do
		"$pb" connections -url "ws://127.0.0.1:$((18180 + i))" -dev -api-key "$KEY" -n 16667 -hold 90s -json \
			>"$out/cluster-connections-node$i.json" 2>"$out/cluster-connections-node$i.progress" &
		tools+=($!)
	done
	wait "${tools[@]}" || true
	cat "$out"/cluster-connections-node*.json
	stop_nodes
fi

psql "$PG_ADMIN_URL" -qc "DROP DATABASE IF EXISTS $db" >/dev/null || true
if command -v redis-cli >/dev/null; then # the scale-out nodes' keys
	redis-cli -u "$REDIS_URL" --scan --pattern "${prefix}*" | xargs -r -n 1000 redis-cli -u "$REDIS_URL" del >/dev/null || true
fi
echo
echo "results in $out"

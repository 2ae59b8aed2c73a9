#!/bin/bash
# One scale-out node (Redis, PostgreSQL and NATS on their standard local
# ports) under HTTP heartbeats from the load tool, with the CPU Redis and
# the node spent, and Redis's top-level calls, over the measured run:
#
#   scripts/http-heartbeat-bench.sh PRESENCED_BINARY [DEVICES]
#
# DEVICES beat every 500 ms (default 5,000: 10,000 beats/s offered) after
# a 5 s warm-up. Needs redis-cli, psql, curl, bc, and presence-bench on
# PATH or in $PB (go build -o /tmp/pb ./cmd/presence-bench). It creates
# the PostgreSQL database bench_hb and a fresh Redis key prefix per run.
set -eu
bin=$1
n=${2:-5000}
pb=${PB:-presence-bench}
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
KEY=bench-key-0123456789abcdef0123456789 # 32 bytes at least outside -dev
ulimit -n 20000
psql -h 127.0.0.1 -U postgres -c 'CREATE DATABASE bench_hb' >/dev/null 2>&1 || true
"$bin" -addr 127.0.0.1:18180 -api-key "$KEY" -jwt-secret bench-secret-0123456789abcdef0123456789 \
	-redis-url redis://127.0.0.1:6379/0 -redis-prefix "hb$RANDOM$RANDOM:" \
	-postgres-url 'postgres://postgres@127.0.0.1:5432/bench_hb?sslmode=disable' \
	-nats-url nats://127.0.0.1:4222 -data "$data/node" >"$data/node.log" 2>&1 &
pid=$!
for _ in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:18180/readyz && break; sleep 0.2; done
rcpu() { redis-cli INFO cpu | awk -F: '/used_cpu_(sys|user):/{s+=$2} END{printf "%.3f", s}'; }
calls() { redis-cli INFO commandstats | awk -F'[:=,]' '/^cmdstat_(evalsha|eval|hmget|hgetall):/{s+=$3} END{print s+0}'; }
ncpu() { awk '{print ($14+$15)/100}' "/proc/$pid/stat"; }
"$pb" heartbeats -url http://127.0.0.1:18180 -transport http -api-key "$KEY" -n "$n" -interval 500ms -duration 5s >/dev/null 2>&1
r0=$(rcpu); n0=$(ncpu); k0=$(calls)
"$pb" heartbeats -url http://127.0.0.1:18180 -transport http -api-key "$KEY" -n "$n" -interval 500ms -duration 20s | tee "$data/pb.out"
r1=$(rcpu); n1=$(ncpu); k1=$(calls)
kill "$pid"; wait "$pid" 2>/dev/null || true
acc=$(awk '/accepted\/s/{print $2}' "$data/pb.out")
beats=$(echo "$acc * 20" | bc)
echo "redis CPU $(echo "$r1 - $r0" | bc) s = $(echo "scale=1; ($r1 - $r0) * 1000000 / $beats" | bc) µs a beat;" \
	"node CPU $(echo "$n1 - $n0" | bc) s = $(echo "scale=1; ($n1 - $n0) * 1000000 / $beats" | bc) µs a beat;" \
	"Redis calls (scripts, HMGET, HGETALL, in scripts included) $(echo "scale=2; ($k1 - $k0) / $beats" | bc) a beat"

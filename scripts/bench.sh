#!/usr/bin/env bash
# Runs the benchmarks whose figures docs/benchmarks.md publishes. Each line
# is a testing.B benchmark; compare figures only within one run (the
# machine is shared and noisy). Extra arguments go to every `go test`.
set -euo pipefail
cd "$(dirname "$0")/.."
count=${BENCH_COUNT:-3}
echo "# $(date -u +%FT%TZ) $(go version) on $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
go test -run '^$' -bench 'HeartbeatNoChange|ShardedMapUpdate' -benchtime 3s -count "$count" "$@" ./internal/tracker/
go test -run '^$' -bench 'Read1000' -benchtime 3s -count "$count" "$@" ./internal/query/
go test -run '^$' -bench 'HTTPBatch1000' -benchtime 2s -count "$count" "$@" ./internal/httpapi/
go test -run '^$' -bench 'SaveLastSeen' -benchtime 2s -count "$count" "$@" ./internal/sqlitestore/

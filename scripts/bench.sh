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
# The status path: the durable write alone (set
# PRESENCED_BENCH_POSTGRES_URL for a PostgreSQL that syncs its commits;
# the test server runs with fsync off), acknowledged changes, and a change
# to 500 watchers' sockets.
go test -run '^$' -bench 'SaveStatus' -benchtime 2s -count "$count" "$@" ./internal/sqlitestore/ ./internal/pgstore/
go test -run '^$' -bench 'SetStatus' -benchtime 2s -count "$count" "$@" ./internal/tracker/
go test -run '^$' -bench 'Status500|Fanout500' -benchtime 2s -count "$count" "$@" ./internal/gateway/
# Writes under a flood: replacing a 10,000-entry contact list,
# and one user's status change on an embedded node while 8 backend
# connections replace such lists in a loop (p50/p99/max as metrics).
go test -run '^$' -bench 'SetContacts' -benchtime 20x -count "$count" "$@" ./internal/sqlitestore/ ./internal/pgstore/
go test -run '^$' -bench 'BystanderStatus' -benchtime 200x -count "$count" "$@" ./internal/app/

// Command presence-bench is presenced's load tool. It drives a running
// presenced over loopback and reports what the server pays for it.
//
// Scenarios:
//
//	connections  open -n idle WebSocket connections that only heartbeat, and
//	             report the server's memory per connection (RSS from /proc,
//	             Go heap from /metrics) before and after
//	heartbeats   -n devices beat every -interval over WebSocket (one socket
//	             each, written by a few sender goroutines with one
//	             pre-encoded frame) or HTTP (POST /v1/heartbeat); sent and
//	             accepted beats/s (presenced_heartbeats_total), server and
//	             generator CPU from /proc/<pid>/stat
//	batch        seed -users over HTTP, then -concurrency clients read -ids
//	             random ids per request, GET then POST; latency percentiles
//	             from a log-linear histogram, reads/s
//	limits       redis-benchmark SET and SETEX with -P 16, and an in-process
//	             256-shard map updated from every core
//
// With -baseline-redis, heartbeats and batch play the same load against
// Redis afterwards the way a naive design does (one SETEX round trip per
// beat over -baseline-conns plain connections; one MGET per read), print it
// side by side with the ratio, and delete their keys.
//
// Example:
//
//	presence-bench connections -url ws://127.0.0.1:18090 -n 15000 -dev -api-key k
//	presence-bench heartbeats -url ws://127.0.0.1:18080 -dev -api-key k -n 15000 -interval 150ms
//
// With -json each scenario prints one object; its field names are stable:
//
//	heartbeats  scenario url transport devices interval target_beats_per_sec
//	            warmup duration server_pid connected connect_failed
//	            connect_seconds; over the measured window: sent accepted
//	            sent_per_sec accepted_per_sec server_cpu_cores
//	            generator_cpu_cores; over the whole run: sent_total
//	            accepted_total errors rate_limited first_error; baseline
//	            {redis conns sent accepted sent_per_sec accepted_per_sec
//	            errors first_error redis_pid redis_cpu_cores
//	            generator_cpu_cores keys_deleted ratio}
//	batch       scenario url users ids_per_read concurrency duration
//	            server_pid seeded seed_seconds seed_errors get post, each
//	            {reads reads_per_sec errors first_error server_cpu_cores
//	            latency {count mean_ms p50_ms p99_ms p999_ms max_ms}};
//	            baseline {redis seed_seconds mget keys_deleted
//	            ratio_reads_per_sec ratio_p99}
//	limits      scenario redis requests pipeline redis_set_per_sec
//	            redis_setex_per_sec redis_benchmark_version map_users
//	            map_shards map_goroutines map_duration map_updates
//	            map_updates_per_sec
//
// The tool refuses any server that is not on a loopback address: it is a
// load generator, not something to point at someone else's machine.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: presence-bench <scenario> [flags]

scenarios:
  connections   idle WebSocket connections; server memory per connection
  heartbeats    devices beating over WebSocket or HTTP; accepted beats/s, server CPU
  batch         concurrent batch reads of 1,000 ids; latency percentiles, reads/s
  fanout        watchers of users who change status; change-to-socket latency
  churn         flaky devices; false and missed offlines, detection lag
  limits        raw limits of this machine: redis-benchmark SETEX, in-process map
  plot          SVG plots from -json results

run "presence-bench connections -h" for the flags of a scenario
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "connections":
		cfg, err := parseConnections(args[1:], stderr)
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if err != nil {
			fmt.Fprintf(stderr, "presence-bench: %v\n", err)
			return 2
		}
		if cfg.worker {
			if err := runWorker(cfg, os.Stdin, stdout); err != nil {
				fmt.Fprintf(stderr, "presence-bench worker: %v\n", err)
				return 1
			}
			return 0
		}
		if err := runConnections(cfg, stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "presence-bench: %v\n", err)
			return 1
		}
		return 0
	case "heartbeats":
		return runHeartbeatsCmd(args[1:], stdout, stderr)
	case "batch":
		return runBatchCmd(args[1:], stdout, stderr)
	case "limits":
		return runLimitsCmd(args[1:], stdout, stderr)
	case "fanout":
		return runFanoutCmd(args[1:], stdout, stderr)
	case "churn":
		return runChurnCmd(args[1:], stdout, stderr)
	case "plot":
		return runPlotCmd(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "presence-bench: unknown scenario %q\n%s", args[0], usage)
		return 2
	}
}

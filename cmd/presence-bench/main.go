// Command presence-bench is presenced's load tool. It drives a running
// presenced over loopback and reports what the server pays for it:
//
//	connections  memory per idle WebSocket connection
//	heartbeats   accepted beats/s over WebSocket or HTTP, server and generator CPU
//	batch        batch reads of random ids: reads/s and latency percentiles
//	fanout       latency of a change to every watcher, across nodes too
//	churn        false and missed offlines, and detection lag, of flaky devices
//	rooms        latency of a join or leave to every watcher of the room, beside a status change
//	room-count   reads of a room of 100,000 members
//	room-memory  server memory per room membership
//	room-interval a big room under joins and leaves: messages per watcher, server CPU
//	storm        a node killed under load: others' fan-out and status write latency, reconnects
//	limits       the machine's raw ceilings: redis-benchmark and a sharded map
//	plot         the SVG figures of docs/img from their JSON
//
// With -baseline-redis, heartbeats, batch and fanout also play their load
// against Redis as a naive design does; with -json a scenario prints JSON:
//
//	presence-bench connections -url ws://127.0.0.1:18090 -n 15000 -dev -api-key k
//
// The tool refuses any server that is not on a loopback address: it is a
// load generator, not something to point at someone else's machine. Its
// scenarios, flags and JSON fields are in docs/load-tool.md; the figures it
// measured, in docs/benchmarks.md.
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
  rooms         watchers of a room and of status users; join/leave and status latency
  room-count    a room of 100,000 members read over HTTP; latency percentiles
  room-memory   users online, then in rooms; server memory per membership
  room-interval a room of 100,000 in interval mode under joins and leaves; messages per watcher, server CPU
  storm         a node killed, its clients reconnect to the others; everyone else's latency
  write-probe   one user's status written every 50 ms, each write's latency (storm runs one)
  storm-killed  the killed node's sockets of a storm, in a process of their own (storm runs it)
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
	case "rooms":
		return runRoomsCmd(args[1:], stdout, stderr)
	case "room-count":
		return runRoomCountCmd(args[1:], stdout, stderr)
	case "room-memory":
		return runRoomMemCmd(args[1:], stdout, stderr)
	case "room-interval":
		return runRoomIntervalCmd(args[1:], stdout, stderr)
	case "storm":
		return runStormCmd(args[1:], stdout, stderr)
	case "storm-killed":
		return runStormKilledCmd(args[1:], os.Stdin, stdout, stderr)
	case "write-probe":
		return runWriteProbeCmd(args[1:], stdout, stderr)
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

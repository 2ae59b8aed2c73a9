// Command presence-bench is presenced's load tool. It drives a running
// presenced over loopback and reports what the server pays for it.
//
// Scenarios:
//
//	connections  open -n idle WebSocket connections that only heartbeat, and
//	             report the server's memory per connection (RSS from /proc,
//	             Go heap from /metrics) before and after
//
// Example:
//
//	presence-bench connections -url ws://127.0.0.1:18090 -n 15000 -dev -api-key k
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
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "presence-bench: unknown scenario %q\n%s", args[0], usage)
		return 2
	}
}

// Command presenced is the presence service: `go run ./cmd/presenced`
// starts the embedded single-node default on :8080 with its state under
// ./data and nothing else installed.
//
// run parses the flags, each also set by its environment variable
// (flags.go; their defaults are app.Defaults), into an app.Config
// (config.go), resolves the credentials (secrets.go) and runs the node
// (serve.go) — or one of the actions -version, -healthcheck and
// -print-token (actions.go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal starts a graceful shutdown, a second one
	// kills the process the usual way.
	context.AfterFunc(ctx, stop)
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "presenced:", err)
		os.Exit(1)
	}
}

// run is the command, with its arguments, environment (getenv) and
// output as parameters: it returns when the node stopped (ctx done) or
// the action is done.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	o, err := parse(args, getenv, stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return nil
	case err != nil:
		return err
	case o.showVersion:
		fmt.Fprintln(stdout, "presenced", version())
		return nil
	case o.healthURL != "":
		return healthcheck(ctx, o.healthURL, stdout)
	}
	if err := o.checkPrintToken(); err != nil {
		return err
	}
	log, err := o.logger(stderr)
	if err != nil {
		return err
	}
	log.Info("presenced", "version", version())
	cfg, err := o.config(log)
	if err != nil {
		return err
	}
	if err := o.credentials(&cfg, log); err != nil {
		return err
	}
	if o.printToken != "" {
		return signToken(stdout, o.printToken, o.printTokenRooms, cfg)
	}
	if cfg.Dev {
		log.Warn("INSECURE DEVELOPMENT MODE (-dev): requests without credentials are accepted for any user id. Never use it in production.")
	}
	return serve(ctx, cfg, o.pprofAddr, getenv)
}

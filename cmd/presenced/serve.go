package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/tracing"
)

// serve runs the node of cfg until ctx is done, with what the command
// adds around it: the reload of the TLS certificate on SIGHUP,
// OpenTelemetry traces and the profiling endpoints.
func serve(ctx context.Context, cfg app.Config, pprofAddr string, getenv func(string) string) error {
	log := cfg.Logger
	var hup chan os.Signal
	if cfg.TLSCertFile != "" {
		// Taken before the node exists, so that an early SIGHUP does not
		// end the process (its default action); handled once it runs.
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}
	// OpenTelemetry traces, exported over OTLP only when the standard
	// OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variables name a collector.
	stopTracing, err := tracing.Setup(ctx, getenv)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(sctx); err != nil {
			log.Warn("tracing: spans not exported at shutdown", "err", err)
		}
	}()
	if tracing.On() {
		log.Info("tracing: exporting spans over OTLP")
	}
	a, err := app.New(ctx, cfg)
	if err != nil {
		return err
	}
	if hup != nil {
		defer reloadTLS(a, hup, cfg)()
	}
	if pprofAddr != "" {
		stop, err := servePprof(pprofAddr, log)
		if err != nil {
			a.Close()
			return err
		}
		defer stop()
	}
	return a.Run(ctx, nil)
}

// reloadTLS loads a's certificate again on every signal on hup until
// stop is called.
func reloadTLS(a *app.App, hup <-chan os.Signal, cfg app.Config) (stop func()) {
	done := make(chan struct{})
	reloaded := make(chan struct{})
	go func() {
		defer close(reloaded)
		for {
			select {
			case <-hup:
				cfg.Logger.Info("SIGHUP: loading the TLS certificate again", "cert", cfg.TLSCertFile, "key", cfg.TLSKeyFile)
				_ = a.ReloadTLS() // logged either way; a bad pair keeps the one in use
			case <-done:
				return
			}
		}
	}()
	return func() { close(done); <-reloaded }
}

// servePprof serves net/http/pprof on addr, which must be a loopback
// address: profiles show user ids and more. stop shuts it down.
func servePprof(addr string, log *slog.Logger) (stop func(), err error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("-pprof-addr %q: %v", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("-pprof-addr %q: only a loopback address (profiles reveal user data)", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-pprof-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	log.Info("profiling endpoints", "addr", ln.Addr().String())
	return func() {
		srv.Close()
		<-done
	}, nil
}

// Package app is the composition root of one presenced node. Config says
// what to build; a zero field takes its value from Defaults, which are
// also cmd/presenced's flags.
//
// New builds the node as a list of components, one small open step each,
// in the order of opening its list gives. A step builds its component and
// declares its part (parts.go): how it runs, in which phase Run stops it,
// what it releases, what readiness checks of it and whether it takes the
// tracker's changes; it also sets the counters metrics reads. Adding a
// component is its open step and its line in New.
//
// Run serves the edges while the parts run; then it stops taking
// requests, stops the parts phase by phase (the gateway first, the
// tracker with its last checkpoint before what carries changes out, the
// hub last), and Close releases them in reverse order of opening, the
// durable store last.
package app

import (
	"context"
	"errors"
	"net"
	"net/http"

	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/wsaccept"
)

// New opens the stores and builds the node, part by part in the order
// below; a step that fails closes what the steps before opened. Call Run
// to serve, or use Handler in tests; Close releases everything.
func New(ctx context.Context, cfg Config) (*App, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	a := &App{cfg: cfg, log: cfg.Logger, rules: presence.Rules{TTL: cfg.TTL, IdleAfter: cfg.IdleAfter,
		MaxDevices: cfg.MaxDevices, CloseGrace: cfg.CloseGrace}.WithDefaults()}
	for _, open := range []func(context.Context) error{
		a.prepareEdges, // origins, Host names, TLS certificate: before anything opens
		a.openDurable,  // SQLite or PostgreSQL, and this run's epoch
		a.openState,    // memory or Redis
		a.openHub,      // with the contact relay and the resyncer
		a.openRooms,    // the watchers of rooms
		a.openReplica,  // -read-replica, -read-replica-users
		a.openBus,      // -nats-url
		a.openWebhooks, // -webhook-url
		a.openKafkaOut, // -kafka-brokers
		a.openBeacon,   // and the peers: NATS and Redis
		a.openTracker,  // the only code that changes presence
		a.openIngest,   // NATS, unless -no-ingest
		a.openKafkaIn,  // -kafka-brokers
		a.openReader,   // the edges' bulk reads
		a.openEdges,    // gateway, metrics, HTTP API
	} {
		if err := open(ctx); err != nil {
			a.release()
			return nil, err
		}
	}
	return a, nil
}

// Run serves on ln (or on cfg.Addr when ln is nil) until ctx is done, then
// shuts down gracefully: stop taking requests, finish the ones in flight,
// close every WebSocket with 1001, stop the ingest consumers, stop the
// tracker (its last checkpoint), then the bus and what else carries
// changes out, then the hub; Close.
func (a *App) Run(ctx context.Context, ln net.Listener) error {
	l, err := a.listen(ln)
	if err != nil {
		a.Close()
		return err
	}
	defer l.health.close() // probes are answered (/readyz: draining) until the end
	running := startParts(ctx, a.parts)
	err = a.serve(ctx, l)
	err = errors.Join(err, running.stop())
	if cerr := a.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	a.log.Info("presenced stopped")
	return err
}

// Close writes the last checkpoint and closes what New opened, in reverse
// order of opening. It is idempotent; Run calls it.
func (a *App) Close() error {
	a.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
		defer cancel()
		a.closeErr = errors.Join(a.tracker.Close(ctx), a.release())
	})
	return a.closeErr
}

// Handler is the node's HTTP API and WebSocket endpoint. WebSockets are
// accepted only while Run runs.
func (a *App) Handler() http.Handler { return a.handler }

// Patterns returns the net/http patterns of every route the node's
// Handler serves: the HTTP API's (httpapi.Server.Patterns) and the
// WebSocket upgrade. The API description is checked against them.
func (a *App) Patterns() []string { return append(a.api.Patterns(), "GET "+wsPath) }

// BrowserPatterns returns the patterns of the endpoints a browser page
// calls with a client token (httpapi.Server.BrowserPatterns): CORS for
// allowed origins, and a preflight (OPTIONS) on each of their paths.
func (a *App) BrowserPatterns() []string { return a.api.BrowserPatterns() }

// ReloadTLS loads the certificate and key files again (on SIGHUP): new
// handshakes present the new pair; a pair that does not load leaves the
// one in use, and the error says why. Without TLS it is an error.
func (a *App) ReloadTLS() error {
	if a.cert == nil {
		return errors.New("no TLS certificate to reload: the node serves plain HTTP")
	}
	return a.cert.Reload()
}

// TLS reports whether the clients' listener serves HTTPS and WSS.
func (a *App) TLS() bool { return a.cert != nil }

// AcceptStats counts the first requests the clients' listener took as
// WebSocket upgrades without net/http, and the connections it passed on.
func (a *App) AcceptStats() wsaccept.Stats {
	if l := a.accept.Load(); l != nil {
		return l.Stats()
	}
	return wsaccept.Stats{}
}

// Gateway is the node's WebSocket gateway (tests read its counters).
func (a *App) Gateway() *gateway.Gateway { return a.gw }

// Tracker is the node's tracker (tests drive sweeps and checkpoints).
func (a *App) Tracker() *tracker.Tracker { return a.tracker }

package app

import (
	"context"
	"errors"
	"fmt"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/connbudget"
	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/httpapi"
	"github.com/presenced/presenced/internal/metrics"
	"github.com/presenced/presenced/internal/origin"
	"github.com/presenced/presenced/internal/query"
	"github.com/presenced/presenced/internal/ratelimit"
	"github.com/presenced/presenced/internal/tlscert"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/web"
)

// prepareEdges reads what the edges take from the configuration — the
// browser pages (origins), the Host names, the TLS certificate — before
// anything is opened: a mistake in them changes nothing.
func (a *App) prepareEdges(context.Context) error {
	var err error
	if a.origins, err = origin.Parse(a.cfg.AllowedOrigins); err != nil {
		return fmt.Errorf("allowed origins: %w", err)
	}
	// The Host names as the configuration says; Run decides again from
	// the address it listens on.
	hosts, err := a.hostsFor(a.cfg.Addr)
	if err != nil {
		return fmt.Errorf("allowed hosts: %w", err)
	}
	a.hosts.Store(hosts)
	if a.cfg.TLSCertFile != "" || a.cfg.TLSKeyFile != "" {
		if a.cert, err = tlscert.Load(a.cfg.TLSCertFile, a.cfg.TLSKeyFile, a.cfg.Logger.With("component", "tls")); err != nil {
			return err
		}
	}
	return nil
}

// openReader builds the bulk reads of the edges: the tracker reads the
// store, or what the node knows while Redis is down; with a read replica
// the status-only batch is read from it. A room's members are the
// tracker's too (tracker.ErrRoomsUnsupported on a store without rooms).
func (a *App) openReader(context.Context) error {
	qc := query.Config{States: a.tracker, Profiles: a.durable, Contacts: a.durable, Clock: a.cfg.Clock,
		ColdVersionMargin: a.reloadMargin(), Rooms: roomPages{a.tracker}}
	if a.replica != nil {
		qc.Statuses, qc.Views = a.replica, fullViews{a.replica}
	}
	var err error
	a.reader, err = query.New(qc)
	return err
}

// roomPages is the tracker as the reader reads rooms' members.
type roomPages struct{ t *tracker.Tracker }

func (p roomPages) RoomPage(ctx context.Context, room, after string, limit int, out []string) (query.RoomPage, error) {
	pg, err := p.t.RoomPage(ctx, room, after, limit, out)
	return query.RoomPage(pg), err
}

// openEdges builds the WebSocket gateway, the metrics and the HTTP API,
// which share the node's authentication and one user's write limits, and
// the routes between them. Run serves them.
func (a *App) openEdges(context.Context) error {
	authn := auth.New(auth.Config{
		APIKey:      a.cfg.APIKey,
		JWTSecret:   a.cfg.JWTSecret,
		Dev:         a.cfg.Dev,
		Clock:       a.cfg.Clock,
		MaxLifetime: a.cfg.MaxTokenLifetime,
		Audience:    a.cfg.TokenAudience,
		Issuer:      a.cfg.TokenIssuer,
	})
	// One user's writes count once, whichever edge they come through.
	writes := ratelimit.NewWrites()
	if err := a.openGateway(authn, writes); err != nil {
		return err
	}
	a.stats.Connections = a.connStats
	a.metrics = metrics.New(a.stats)
	if err := a.openAPI(authn, writes); err != nil {
		return err
	}
	a.handler = routes{api: a.api, ws: a.gw, hosts: &a.hosts}
	return nil
}

// openGateway builds the WebSocket gateway; Run runs it until the
// WebSockets are closed, first of all.
func (a *App) openGateway(authn *auth.Authenticator, writes *ratelimit.Writes) error {
	var err error
	a.gw, err = gateway.New(gateway.Config{
		Writes:               writes,
		Tracker:              a.edge,
		Reader:               a.reader,
		Auth:                 authn,
		Clock:                a.cfg.Clock,
		Logger:               a.cfg.Logger.With("component", "ws"),
		TTL:                  a.cfg.TTL,
		CloseGrace:           a.rules.CloseGrace,
		MaxSubscriptions:     a.cfg.MaxSubscriptions,
		MaxUserSubscriptions: a.cfg.MaxUserSubscriptions, // zero: the gateway's 10 × MaxSubscriptions
		MaxSocketsPerUser:    a.cfg.MaxSocketsPerUser,
		MaxSocketsPerDevice:  a.cfg.MaxSocketsPerDevice,
		Hub:                  a.hub,
		Rooms:                a.rooms,
		Workers:              gatewayWorkers(a.cfg),
		BeatsMayWait:         beatsMayWait(a.cfg, a.webhooks != nil),
		Origins:              a.origins,
	})
	if err != nil {
		return err
	}
	a.stats.Gateway = a.gw.Stats
	a.add(part{run: a.gw.Run, stop: stopGateway})
	return nil
}

// beatsMayWait says whether a socket's heartbeat may wait (gateway.Config):
// with webhooks a change waits for their log; with Redis a beat that
// changes something, or claims its device again, waits for Redis, and a
// Redis that hangs must not stall every socket's reads.
func beatsMayWait(cfg Config, webhooks bool) bool {
	return webhooks || cfg.RedisURL != ""
}

// openAPI builds the HTTP API.
func (a *App) openAPI(authn *auth.Authenticator, writes *ratelimit.Writes) error {
	var err error
	a.api, err = httpapi.New(httpapi.Config{
		Tracker:           a.edge,
		Reader:            a.reader,
		Contacts:          a.durable,
		Profiles:          a.durable,
		Auth:              authn,
		Clock:             a.cfg.Clock,
		Logger:            a.cfg.Logger.With("component", "http"),
		Rules:             a.rules,
		Metrics:           a.metrics,
		MetricsHandler:    a.metrics.Handler(),
		Checks:            a.readiness(),
		PollInterval:      a.cfg.PollInterval,
		Static:            web.New(),
		Admin:             newAdminSource(a),
		OnContactsChanged: a.contactsChanged,
		Origins:           a.origins,
		Writes:            writes,
	})
	return err
}

// readiness lists what GET /readyz checks (httpapi.Check), in this order:
// the gateway, this node's own, then what each part declared in the order
// they opened — an embedded SQLite file is the node's own too; PostgreSQL,
// Redis, NATS and Kafka are shared by every node, so their outages are
// reported without failing readiness (docs/operations.md).
func (a *App) readiness() []httpapi.Check {
	checks := []httpapi.Check{{Name: "gateway", Check: func(context.Context) error {
		if !a.gw.Serving() {
			return errors.New("the WebSocket gateway does not take connections (starting or stopping)")
		}
		return nil
	}}}
	for _, p := range a.parts {
		if p.check.Check != nil {
			checks = append(checks, p.check)
		}
	}
	return checks
}

// connStats counts the clients' connections once Run serves them.
func (a *App) connStats() connbudget.Stats {
	if b := a.budget.Load(); b != nil {
		return b.Stats()
	}
	return connbudget.Stats{}
}

// gatewayWorkers is how many goroutines read WebSockets. With the state in
// memory a heartbeat waits for nothing, and 16 keep two cores busy. With
// Redis each one waits for its script's round trip: only as many
// heartbeats are in flight — and pipelined together by the client — as
// there are workers, so a few hundred keep Redis, not the round trip, the
// limit (measured: 16 workers held one node to 6.7k beats/s). With
// webhooks, either way, a heartbeat that changes the user's status also
// waits until the change is in their log (confirm.go: the outbox's fsync,
// shared by the changes queued with it, or the stream's ack), at most
// webhook.Config.ConfirmTimeout and not at all while that log is known
// failing; one that changes nothing waits for nothing more.
func gatewayWorkers(cfg Config) int {
	if cfg.RedisURL != "" {
		return 512
	}
	return 16
}

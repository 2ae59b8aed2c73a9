package app

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/beacon"
	"github.com/presenced/presenced/internal/connbudget"
	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/httpapi"
	"github.com/presenced/presenced/internal/ingest"
	"github.com/presenced/presenced/internal/jsstream"
	"github.com/presenced/presenced/internal/kafka"
	"github.com/presenced/presenced/internal/metrics"
	"github.com/presenced/presenced/internal/natsbus"
	"github.com/presenced/presenced/internal/origin"
	"github.com/presenced/presenced/internal/peers"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/query"
	"github.com/presenced/presenced/internal/replica"
	"github.com/presenced/presenced/internal/tlscert"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/webhook"
	"github.com/presenced/presenced/internal/wsaccept"
)

// App is one running node: the parts New opened, and the handles by
// which they are wired to each other.
type App struct {
	cfg   Config
	rules presence.Rules
	log   *slog.Logger
	// parts are the node's components in the order they opened: Run
	// starts and stops them, Close releases them in reverse.
	parts []part
	// stats are the counters the parts export, each set by the part
	// that has them (nil without it); metrics reads them at scrape time.
	stats metrics.Sources

	durable  durableStore
	store    tracker.Store
	redis    rueidis.Client   // nil: embedded hot state
	hub      *fanout.Hub      // who on this node watches whom
	rooms    *fanout.RoomHub  // who on this node watches which room
	contacts *contactRelay    // hands changed contact lists to the hub
	resync   *resyncer        // sends watchers the current state when asked
	replica  *replica.Replica // nil without Redis and NATS, or with ReadReplicaUsers < 0
	nats     *jsstream.Conn   // nil without NATS: the one connection of all that uses NATS
	bus      *natsbus.Bus     // nil without NATS
	webhooks *webhook.Sender  // nil without webhook URLs
	kafkaOut *kafka.Producer  // nil without Kafka or with NoKafkaChanges
	beacon   *beacon.Beacon   // nil without NATS or Redis: node liveness apart from Redis
	peers    *peers.Peers     // nil without NATS or Redis: what other nodes hold of devices, for degraded reads
	tracker  *tracker.Tracker // the only code that changes presence
	edge     edgeTracker      // the tracker as the edges and ingest consumers change through it
	reader   *query.Reader    // the edges' bulk reads

	// replicaDeaf: another live node went unheard on the bus and the
	// replica refused; it is filled again once all are heard.
	replicaDeaf atomic.Bool
	// replicaReconnects is the NATS connection's reconnection count when
	// the bus last told of one (missedChanges).
	replicaReconnects atomic.Uint64

	// The edges.
	origins *origin.Policy                      // the browser pages the edges take
	cert    *tlscert.Store                      // nil: plain HTTP
	gw      *gateway.Gateway                    // WebSockets
	api     *httpapi.Server                     // everything else
	metrics *metrics.Registry                   // /metrics and the operator page
	handler http.Handler                        // routes to gw and api
	budget  atomic.Pointer[connbudget.Listener] // set by Run before it serves
	accept  atomic.Pointer[wsaccept.Listener]   // set by Run before it serves
	// hosts are the Host names the node answers to (origin.Hosts): set by
	// New from the configuration, and by Run from the address it listens on.
	hosts atomic.Pointer[origin.Hosts]

	closeOnce sync.Once
	closeErr  error
}

// durableStore is what a node needs of its durable store (sqlitestore or
// pgstore).
type durableStore interface {
	tracker.Durable
	httpapi.ContactBook
	fanout.Relations
	fanout.ContactLists
	NextEpoch(ctx context.Context) (uint64, error)
	Ping(ctx context.Context) error
	Close() error
}

// edgeTracker is the tracker as the edges and the ingest consumers are
// given it: the tracker itself, or with webhooks confirming (confirm.go).
type edgeTracker interface {
	httpapi.Tracker
	httpapi.HeartbeatReader
	httpapi.RoomTracker
	gateway.Tracker
	ingest.Tracker
	kafka.Owner
}

var _ edgeTracker = confirming{}

// part is one component of the node as its constructor (an open step of
// New) declares it: how it runs, when it stops, what it releases, what
// readiness asks of it and whether it takes the tracker's changes. Every
// field may be left zero.
type part struct {
	// run runs the part until its context is done; Run reports its error.
	run  func(ctx context.Context) error
	stop phase // when Run cancels run's context
	// close releases what the constructor opened: on Close, or when a
	// later step of New fails.
	close func() error
	// check is what GET /readyz asks of the part (none when Check is
	// nil): after the gateway's, in the order the parts opened.
	check httpapi.Check
	// publish takes every change this node makes (tracker.Publisher),
	// after the debug log, in the order the parts opened.
	publish tracker.Publisher
}

// add appends p to the node's parts.
func (a *App) add(p part) { a.parts = append(a.parts, p) }

// phase is when Run stops a part, once the HTTP server stopped taking
// requests: phase by phase in this order, each waiting for every run of
// the one before to return. Within a phase parts start and stop together;
// Run starts the phases in reverse order.
type phase int

const (
	// stopGateway closes the WebSockets (1001), which are not the HTTP
	// server's, while the tracker still takes their last operations.
	stopGateway phase = iota
	// stopIngest stops what drives the tracker from outside (a Kafka
	// consumer leaves its group: its partitions move at once).
	stopIngest
	// stopTracker ends the tracker with its last checkpoint.
	stopTracker
	// stopBus stops what carries changes out, which outlives the tracker
	// so that its last changes go out.
	stopBus
	// stopLast stops the hub and the resyncer, which the others feed.
	stopLast
	phases // how many
)

// running is the parts Run started.
type running struct {
	parts  []part
	errs   []error // of parts[i].run, once its phase stopped
	cancel [phases]context.CancelFunc
	wg     [phases]sync.WaitGroup
}

// startParts runs every part that runs, the phases that stop last first.
// Their contexts keep ctx's values but not its end: stop ends them.
func startParts(ctx context.Context, parts []part) *running {
	r := &running{parts: parts, errs: make([]error, len(parts))}
	var ctxs [phases]context.Context
	for ph := range phases {
		ctxs[ph], r.cancel[ph] = context.WithCancel(context.WithoutCancel(ctx))
	}
	for ph := phases - 1; ph >= 0; ph-- {
		for i, p := range parts {
			if p.run != nil && p.stop == ph {
				r.wg[ph].Go(func() { r.errs[i] = p.run(ctxs[ph]) })
			}
		}
	}
	return r
}

// stop ends the parts phase by phase and returns their errors, in the
// order of the phases and, within one, of the parts.
func (r *running) stop() error {
	var err error
	for ph := range phases {
		r.cancel[ph]()
		r.wg[ph].Wait()
		for i, p := range r.parts {
			if p.stop == ph {
				err = errors.Join(err, r.errs[i])
			}
		}
	}
	return err
}

// release closes what the parts opened, in reverse order of opening.
func (a *App) release() error {
	var err error
	for i := len(a.parts) - 1; i >= 0; i-- {
		if c := a.parts[i].close; c != nil {
			err = errors.Join(err, c())
		}
	}
	return err
}

// quiet is run for a part whose error Run does not report (it logs its
// own, or has none worth stopping for).
func quiet(run func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		_ = run(ctx)
		return nil
	}
}

// noErr is close for a part whose Close returns nothing.
func noErr(close func()) func() error {
	return func() error {
		close()
		return nil
	}
}

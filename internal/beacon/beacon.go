// Package beacon tells the nodes of a deployment that each other is alive
// on a second channel, NATS, apart from the state store. A node takes over
// another node's devices when that node's lease in the store runs out
// (tracker, lease.go); a node that is only cut off from the store (Redis)
// cannot renew its lease, yet still holds its sockets and keeps its
// devices alive. Its beacon, heard on NATS, keeps the others from taking
// it over.
//
// Every Interval a node publishes its lease on the core NATS subject
// "<prefix>.<lease>", its name (Config.Name) as the payload, nothing
// stored, and every node subscribes to
// "<prefix>.*", remembering when it last heard each lease by its own
// clock. Alive(lease) is true if the lease was heard within Timeout — or
// if this node cannot tell: its connection to NATS is down, or came back
// less than Timeout ago (it may have missed beacons) — for at most
// Blind, after which a node that hears nobody judges by the store alone,
// so that a NATS outage does not keep dead nodes' devices alive for ever.
package beacon

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/jsstream"
)

// Config configures a Beacon. Zero values take the documented defaults.
type Config struct {
	Conn *jsstream.Conn // required: the node's NATS connection
	// Subject is the subject prefix. Default "presence.nodes".
	Subject string
	// Interval between two beacons. Default 1s.
	Interval time.Duration
	// Timeout is how long a lease stays alive after its last beacon.
	// Default 3 Intervals.
	Timeout time.Duration
	// Blind bounds how long a node that cannot hear (NATS down) calls
	// every lease alive. Default 30s.
	Blind time.Duration
	// Name is this node's name (-node-id), sent with its beacons so the
	// others can name it (the operator page); empty: nameless.
	Name   string
	Clock  clock.Clock
	Logger *slog.Logger
}

// Beacon publishes this node's liveness and hears the others'. Safe for
// concurrent use.
type Beacon struct {
	cfg Config
	sub *nats.Subscription

	mu      sync.Mutex // guards the fields below
	heard   map[uint64]heard
	downAt  time.Time // when the connection went down (zero: up)
	backAt  time.Time // when it came back (zero: never went down)
	started time.Time
}

// heard is the last beacon of one lease.
type heard struct {
	at   time.Time // by this node's clock
	name string
}

// New subscribes to the other nodes' beacons. Run publishes this node's.
func New(cfg Config) (*Beacon, error) {
	if cfg.Conn == nil {
		return nil, errors.New("beacon: Conn is required")
	}
	if cfg.Subject == "" {
		cfg.Subject = "presence.nodes"
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 3 * cfg.Interval
	}
	if cfg.Blind <= 0 {
		cfg.Blind = 30 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	b := &Beacon{cfg: cfg, heard: make(map[uint64]heard), started: cfg.Clock.Now()}
	nc := cfg.Conn.NC
	cfg.Conn.OnReconnect(func() {
		b.mu.Lock()
		b.downAt, b.backAt = time.Time{}, b.cfg.Clock.Now()
		b.mu.Unlock()
	})
	sub, err := nc.Subscribe(cfg.Subject+".*", func(m *nats.Msg) {
		id, err := strconv.ParseUint(strings.TrimPrefix(m.Subject, cfg.Subject+"."), 10, 64)
		if err != nil {
			return
		}
		name := string(m.Data)
		b.mu.Lock()
		if h, ok := b.heard[id]; ok && h.name == name {
			name = h.name // keep one copy of the string
		}
		b.heard[id] = heard{at: b.cfg.Clock.Now(), name: name}
		b.mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	b.sub = sub
	return b, nil
}

// Run publishes this node's beacon every Interval until ctx is done,
// then unsubscribes. lease returns this node's lease, 0 while it has none
// (nothing is published then): the node's tracker, which exists by the
// time the node runs (and itself asks the beacon which nodes are alive).
func (b *Beacon) Run(ctx context.Context, lease func() uint64) error {
	t := time.NewTicker(b.cfg.Interval)
	defer t.Stop()
	defer func() { _ = b.sub.Unsubscribe() }()
	for {
		b.publish(lease())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (b *Beacon) publish(lease uint64) {
	nc := b.cfg.Conn.NC
	if !nc.IsConnected() {
		b.mu.Lock()
		if b.downAt.IsZero() {
			b.downAt = b.cfg.Clock.Now()
		}
		b.mu.Unlock()
		return
	}
	if lease != 0 {
		_ = nc.Publish(b.cfg.Subject+"."+strconv.FormatUint(lease, 10), []byte(b.cfg.Name))
	}
	// Forget the nodes not heard for long (stopped, or under a new lease).
	now := b.cfg.Clock.Now()
	b.mu.Lock()
	for id, h := range b.heard {
		if now.Sub(h.at) > b.cfg.Blind {
			delete(b.heard, id)
		}
	}
	b.mu.Unlock()
}

// Alive reports whether the node of lease is heard from, or this node
// cannot tell (see the package doc).
func (b *Beacon) Alive(lease uint64) bool {
	now := b.cfg.Clock.Now()
	connected := b.cfg.Conn.NC.IsConnected()
	b.mu.Lock()
	defer b.mu.Unlock()
	if h, ok := b.heard[lease]; ok && now.Sub(h.at) < b.cfg.Timeout {
		return true
	}
	if !connected {
		if b.downAt.IsZero() {
			b.downAt = now
		}
		return now.Sub(b.downAt) < b.cfg.Blind
	}
	// Connected: deaf only just after (re)connecting.
	since := b.started
	if !b.backAt.IsZero() {
		since = b.backAt
	}
	return now.Sub(since) < b.cfg.Timeout
}

// Live returns the leases heard within Timeout (this node's own among
// them once it hears itself): the nodes known alive now.
func (b *Beacon) Live() []uint64 {
	now := b.cfg.Clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]uint64, 0, len(b.heard))
	for id, h := range b.heard {
		if now.Sub(h.at) < b.cfg.Timeout {
			out = append(out, id)
		}
	}
	return out
}

// Node is a node as this node last heard its beacon (Nodes).
type Node struct {
	Lease uint64
	Name  string    // Config.Name of its node; empty if it sent none
	Heard time.Time // its last beacon, by this node's clock
}

// Nodes returns every node heard within Blind (this node's own among
// them once it hears itself), with when each was last heard: alive if
// within Timeout.
func (b *Beacon) Nodes() []Node {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Node, 0, len(b.heard))
	for id, h := range b.heard {
		out = append(out, Node{Lease: id, Name: h.name, Heard: h.at})
	}
	return out
}

// Timeout is how long a node stays alive after its last beacon
// (Config.Timeout, after defaults).
func (b *Beacon) Timeout() time.Duration { return b.cfg.Timeout }

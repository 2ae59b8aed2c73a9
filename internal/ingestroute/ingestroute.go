// Package ingestroute gives each device of the JetStream ingest one
// owning node. The ingest's shared consumer hands any message to any
// node, so no node would hear every beat of a device, and each beat
// would be a write to Redis. Instead the users are split into
// Partitions, each owned by one live node (rendezvous hashing over the
// leases the beacons say are alive, so a node joining or leaving moves
// only its own share): a node that takes an event of a partition it does
// not own forwards it to the owner over core NATS
// ("<Subject>.<owner's lease>") and acknowledges the message once the
// owner answered. The owner applies it as the partition's source
// (tracker.SourceBeat): the node owns the device as it owns its sockets',
// and a beat that changes nothing costs Redis nothing. When a partition
// leaves a node (another node joined, or its view of the live nodes
// changed), the node hands the partition's devices back to the store's
// rules with their real last beats (tracker.HandOffSources).
//
// Nothing is lost when views disagree or a node dies or is slow: an
// owner that does not think it owns the partition applies a beat as an
// ordinary heartbeat, and so does a node whose forward is refused as busy
// or not answered in Timeout (a Redis write, as without this package); a
// device held by two nodes for a while ends by the rules with the last of
// them. A disconnect is never applied by the node that took it when the
// owner does not answer: it would end the device in Redis under an owner
// that still holds it and would not tell Redis again while its beats
// change nothing. It fails instead, and the ingest delivers it again.
package ingestroute

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presenced/presenced/internal/jsstream"
	"github.com/presenced/presenced/internal/presence"
)

// Tracker is what the router needs of the node's tracker; *tracker.Tracker
// implements it.
type Tracker interface {
	Heartbeat(ctx context.Context, user, device string, active bool) (presence.Change, error)
	Bye(ctx context.Context, user, device string) (presence.Change, error)
	SourceBeat(ctx context.Context, src uint32, user, device string, active, connect bool) (presence.Change, error)
	HandOffSources(ctx context.Context, srcs ...uint32) error
}

// Config configures a Router. Zero values take the documented defaults.
type Config struct {
	Conn    *jsstream.Conn // required: the node's NATS connection
	Tracker Tracker        // required
	// Lease is this node's lease in the store (0 while it has none).
	Lease func() uint64
	// Live returns the leases of the nodes heard alive (beacon.Live).
	Live func() []uint64
	// Subject is the prefix of the subjects forwarded events go to.
	// Default "presence.ingest-owner".
	Subject string
	// Partitions is how many parts the users are split into. Every node
	// of a deployment must use the same. Default 256.
	Partitions int
	// Timeout bounds the wait for an owner's answer. Default 1s.
	Timeout time.Duration
	// Suspect is how long an owner that did not answer in time (or could
	// not be reached) is not asked again: its partitions' beats are
	// applied where they are taken, their disconnects fail (delivered
	// again), without waiting. Default 5s.
	Suspect time.Duration
	// Every is how often the router looks at the live nodes again.
	// Default 250ms.
	Every time.Duration
	// HandOffTimeout bounds the hand-off of a partition. Default 5s.
	HandOffTimeout time.Duration
	// Workers bounds the forwarded events applied at once. Default 16.
	Workers int
	Logger  *slog.Logger
}

// Source is the tracker source of partition p: the high bit set, so that
// no number of a Kafka partition's source (p+1) is one.
func Source(p int) uint32 { return 1<<31 | uint32(p) }

// Stats counts what a Router did.
type Stats struct {
	Local     uint64 // events of partitions this node owns, applied here as their owner
	Forwarded uint64 // events forwarded to their owner, which answered
	Received  uint64 // events another node forwarded here
	Fallback  uint64 // beats applied here unowned: no owner known, or the owner was busy or did not answer
	Busy      uint64 // forwarded events this node refused as busy (every worker taken)
	Skipped   uint64 // events not forwarded to an owner that did not answer lately (Config.Suspect)
	HandOffs  uint64 // partitions that left this node, their devices handed off
	Owned     int    // partitions this node owns now
}

// Router routes the events of the JetStream ingest to their partition's
// owner. It implements ingest.Tracker. Safe for concurrent use.
type Router struct {
	cfg  Config
	nc   *nats.Conn
	log  *slog.Logger
	work chan struct{} // a token per forwarded event being applied

	table atomic.Pointer[table] // the owners as this node sees them now

	mu       sync.Mutex // guards sub
	sub      *nats.Subscription
	handlers sync.WaitGroup // the forwarded events being applied
	suspects sync.Map       // owner lease → until when it is not asked (Unix ns)

	local, forwarded, received, fallback, busy, skipped, handOffs atomic.Uint64
}

// table is who owns each partition, as of one view of the live nodes.
type table struct {
	self   uint64   // this node's lease then
	nodes  []uint64 // the live leases, sorted
	owners []uint64 // by partition; 0: nobody known
}

// New returns a Router; it routes nothing to itself until Run has
// subscribed under the node's lease.
func New(cfg Config) (*Router, error) {
	if cfg.Conn == nil || cfg.Tracker == nil || cfg.Lease == nil || cfg.Live == nil {
		return nil, errors.New("ingestroute: Conn, Tracker, Lease and Live are required")
	}
	if cfg.Subject == "" {
		cfg.Subject = "presence.ingest-owner"
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 256
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Suspect <= 0 {
		cfg.Suspect = 5 * time.Second
	}
	if cfg.Every <= 0 {
		cfg.Every = 250 * time.Millisecond
	}
	if cfg.HandOffTimeout <= 0 {
		cfg.HandOffTimeout = 5 * time.Second
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 16
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Router{cfg: cfg, nc: cfg.Conn.NC, log: cfg.Logger, work: make(chan struct{}, cfg.Workers)}, nil
}

// Stats returns the counters so far.
func (r *Router) Stats() Stats {
	s := Stats{Local: r.local.Load(), Forwarded: r.forwarded.Load(), Received: r.received.Load(),
		Fallback: r.fallback.Load(), Busy: r.busy.Load(), Skipped: r.skipped.Load(), HandOffs: r.handOffs.Load()}
	if t := r.table.Load(); t != nil {
		for _, o := range t.owners {
			if o != 0 && o == t.self {
				s.Owned++
			}
		}
	}
	return s
}

// partition is the partition of user: 32-bit FNV-1a, the same on every
// node, computed in place (every event takes it; hash/fnv allocates).
func (r *Router) partition(user string) int {
	h := uint32(2166136261)
	for i := 0; i < len(user); i++ {
		h ^= uint32(user[i])
		h *= 16777619
	}
	return int(h % uint32(r.cfg.Partitions))
}

// score is partition p's rendezvous weight of lease (splitmix64).
func score(p int, lease uint64) uint64 {
	z := lease ^ uint64(p)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// owners maps each of n partitions to the live lease of highest weight.
func owners(n int, live []uint64) []uint64 {
	out := make([]uint64, n)
	for p := range out {
		var best, bestScore uint64
		for _, l := range live {
			if s := score(p, l); best == 0 || s > bestScore || s == bestScore && l > best {
				best, bestScore = l, s
			}
		}
		out[p] = best
	}
	return out
}

// Heartbeat implements ingest.Tracker: a beat of user's device, applied
// by its partition's owner.
func (r *Router) Heartbeat(ctx context.Context, user, device string, active bool) (presence.Change, error) {
	return r.route(ctx, event{User: user, Device: device, Active: active})
}

// Connect implements ingest.Connector: a new session of user's device,
// which its owner claims again whatever it knew of it.
func (r *Router) Connect(ctx context.Context, user, device string, active bool) (presence.Change, error) {
	return r.route(ctx, event{User: user, Device: device, Active: active, Connect: true})
}

// Bye implements ingest.Tracker: a disconnect, sent to the owner too
// (it ends the device in the owner's table at once).
func (r *Router) Bye(ctx context.Context, user, device string) (presence.Change, error) {
	return r.route(ctx, event{User: user, Device: device, Bye: true})
}

// event is one forwarded event.
type event struct {
	User   string `json:"u"`
	Device string `json:"d"`
	Active bool   `json:"a,omitempty"`
	Bye    bool   `json:"b,omitempty"`
	// Connect: a session_connected (SourceBeat's connect).
	Connect bool `json:"c,omitempty"`
	// Budget is how long the sender waits for the answer, in ms. The
	// owner applies the event within it, counted from when it takes it
	// (the nodes' clocks may differ; the hop itself is short), so that it
	// does not apply what its sender applied itself after giving up.
	Budget int64 `json:"t"`
}

// answer is an owner's reply: empty Err when applied; Refused when the
// event itself was refused (too many devices); Busy when the owner took
// no more (the sender applies a beat itself, and fails a disconnect).
type answer struct {
	Err     string `json:"err,omitempty"`
	Refused bool   `json:"refused,omitempty"`
	Busy    bool   `json:"busy,omitempty"`
}

// errNoOwner fails a disconnect whose owner did not take it: the ingest
// delivers it again.
var errNoOwner = errors.New("ingestroute: the owning node did not take the disconnect; it is delivered again")

// errRefused is the owner's refusal of an event, as ingest.Refused sees
// it.
type errRefused struct{ msg string }

func (e errRefused) Error() string { return "refused by the owning node: " + e.msg }
func (e errRefused) Is(target error) bool {
	return target == presence.ErrTooManyDevices
}

func (r *Router) route(ctx context.Context, ev event) (presence.Change, error) {
	p := r.partition(ev.User)
	t := r.table.Load()
	var owner uint64
	if t != nil {
		owner = t.owners[p]
	}
	switch {
	case owner != 0 && owner == t.self:
		r.local.Add(1)
		return r.apply(ctx, p, ev, true)
	case owner == 0:
		r.fallback.Add(1)
		return r.apply(ctx, p, ev, false)
	case r.suspect(owner):
		// It did not answer lately: not waited for again until
		// Suspect has passed.
		r.skipped.Add(1)
		if ev.Bye {
			return presence.Change{}, errNoOwner
		}
		r.fallback.Add(1)
		return r.apply(ctx, p, ev, false)
	}
	fctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	if d, ok := fctx.Deadline(); ok {
		ev.Budget = time.Until(d).Milliseconds()
	}
	data, _ := json.Marshal(ev)
	msg, err := r.nc.RequestWithContext(fctx, r.cfg.Subject+"."+strconv.FormatUint(owner, 10), data)
	var a answer
	if err == nil {
		if err := json.Unmarshal(msg.Data, &a); err != nil {
			return presence.Change{}, fmt.Errorf("ingestroute: owner's answer %q: %w", msg.Data, err)
		}
	}
	if err != nil && ctx.Err() == nil {
		r.suspects.Store(owner, time.Now().Add(r.cfg.Suspect).UnixNano())
	}
	if err != nil || a.Busy {
		// The owner is gone, slow or busy: a beat is applied here,
		// unowned; a disconnect waits for the owner.
		if ev.Bye {
			return presence.Change{}, errNoOwner
		}
		r.fallback.Add(1)
		return r.apply(ctx, p, ev, false)
	}
	switch {
	case a.Refused:
		return presence.Change{}, errRefused{a.Err}
	case a.Err != "":
		return presence.Change{}, fmt.Errorf("ingestroute: owning node: %s", a.Err)
	}
	r.forwarded.Add(1)
	return presence.Change{}, nil // the owner published the change
}

// suspect reports whether owner failed to answer within the last
// Suspect.
func (r *Router) suspect(owner uint64) bool {
	v, ok := r.suspects.Load(owner)
	if !ok {
		return false
	}
	if time.Now().UnixNano() < v.(int64) {
		return true
	}
	r.suspects.CompareAndDelete(owner, v)
	return false
}

// apply applies ev here: as partition p's owner (owned), or as an
// ordinary heartbeat.
func (r *Router) apply(ctx context.Context, p int, ev event, owned bool) (presence.Change, error) {
	switch {
	case ev.Bye:
		return r.cfg.Tracker.Bye(ctx, ev.User, ev.Device)
	case owned:
		return r.cfg.Tracker.SourceBeat(ctx, Source(p), ev.User, ev.Device, ev.Active, ev.Connect)
	default:
		return r.cfg.Tracker.Heartbeat(ctx, ev.User, ev.Device, ev.Active)
	}
}

// receive applies an event another node forwarded, in a goroutine of
// its own, at most Workers at once; when they are all taken it answers
// busy at once rather than hold the sender (and NATS's delivery to this
// node) for its timeout.
func (r *Router) receive(m *nats.Msg) {
	var ev event
	if err := json.Unmarshal(m.Data, &ev); err != nil || ev.User == "" || ev.Device == "" {
		_ = m.Respond(fmt.Appendf(nil, `{"err":%q}`, "not an event"))
		return
	}
	select {
	case r.work <- struct{}{}:
	default:
		r.busy.Add(1)
		_ = m.Respond([]byte(`{"busy":true}`))
		return
	}
	r.handlers.Add(1)
	go func() {
		defer r.handlers.Done()
		defer func() { <-r.work }()
		if ev.Budget <= 0 {
			return // its sender has given up already
		}
		until := time.Now().Add(time.Duration(ev.Budget) * time.Millisecond)
		r.received.Add(1)
		p := r.partition(ev.User)
		t := r.table.Load()
		mine := t != nil && t.owners[p] != 0 && t.owners[p] == t.self
		ctx, cancel := context.WithDeadline(context.Background(), until)
		defer cancel()
		var a answer
		if _, err := r.apply(ctx, p, ev, mine); err != nil {
			a.Err = err.Error()
			a.Refused = errors.Is(err, presence.ErrTooManyDevices)
		}
		data, _ := json.Marshal(a)
		_ = m.Respond(data)
	}()
}

// Run keeps the router's view of the owners current, every Every, and
// its subscription under this node's lease, until ctx is done; then it
// unsubscribes and waits for the forwarded events being applied (what is
// forwarded to it after is the senders' to apply or retry).
func (r *Router) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Every)
	defer t.Stop()
	defer r.unsubscribe()
	for {
		r.refresh(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// refresh takes the live nodes again: subscribes under a new lease,
// recomputes the owners, and hands off the partitions that left.
func (r *Router) refresh(ctx context.Context) {
	self := r.cfg.Lease()
	if err := r.subscribe(self); err != nil {
		r.log.Warn("cannot take forwarded ingest events", "err", err)
		return
	}
	live := r.cfg.Live()
	if self != 0 && !slices.Contains(live, self) {
		live = append(live, self) // its own beacon may not be back yet
	}
	slices.Sort(live)
	old := r.table.Load()
	if old != nil && old.self == self && slices.Equal(old.nodes, live) {
		return
	}
	next := &table{self: self, nodes: live, owners: owners(r.cfg.Partitions, live)}
	r.table.Store(next)
	if old == nil || old.self == 0 {
		return
	}
	var gone []int
	for p, o := range old.owners {
		if o == old.self && next.owners[p] != self {
			gone = append(gone, p)
		}
	}
	if len(gone) == 0 {
		return
	}
	hctx, cancel := context.WithTimeout(ctx, r.cfg.HandOffTimeout)
	defer cancel()
	srcs := make([]uint32, len(gone))
	for i, p := range gone {
		srcs[i] = Source(p)
	}
	if err := r.cfg.Tracker.HandOffSources(hctx, srcs...); err != nil {
		r.log.Warn("handing off ingest partitions' devices did not finish; the rest follows when the state store answers",
			"partitions", len(gone), "err", err)
	}
	r.handOffs.Add(uint64(len(gone)))
	r.log.Info("ingest partitions moved to other nodes", "handed_off", len(gone), "owned", r.Stats().Owned)
}

// subscribe makes sure the router takes forwarded events under lease.
func (r *Router) subscribe(lease uint64) error {
	subj := r.cfg.Subject + "." + strconv.FormatUint(lease, 10)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sub != nil && r.sub.Subject == subj {
		return nil
	}
	if r.sub != nil {
		_ = r.sub.Unsubscribe()
		r.sub = nil
	}
	if lease == 0 {
		return nil
	}
	sub, err := r.nc.Subscribe(subj, r.receive)
	if err != nil {
		return err
	}
	// Before the table names this node the owner of anything: an event
	// forwarded before the server has the subscription finds nobody,
	// and its sender would take this node for suspect.
	if err := r.nc.FlushTimeout(time.Second); err != nil {
		_ = sub.Unsubscribe()
		return err
	}
	r.sub = sub
	return nil
}

// unsubscribe stops taking forwarded events and waits for those being
// applied (their senders are answered; those not taken yet time out at
// their senders).
func (r *Router) unsubscribe() {
	r.mu.Lock()
	if r.sub != nil {
		_ = r.sub.Unsubscribe()
		r.sub = nil
	}
	r.mu.Unlock()
	r.handlers.Wait()
}

package tracker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"

	"github.com/presenced/presenced/internal/presence"
)

// Degraded reports whether some operations do not reach the store now:
// it is down or replaying, or a part of it is (their changes are not
// published until they do). Cheap; safe for concurrent use.
func (t *Tracker) Degraded() bool {
	return !t.link.up() || t.link.partsDown()
}

// The outage buffer: per user, per device the latest operation, the latest
// manual status and the latest settings, in bufShards shards.
const bufShards = 64

type bufShard struct {
	mu    sync.Mutex          // guards users and every *pending in it
	users map[string]*pending // user → what happened while the store was down
	_     [48]byte            // a shard per cache line
}

// opKind names a buffered operation.
type opKind uint8

const (
	opSettings opKind = iota // first at equal times: events then carry them
	opBeat
	opStatus
	opBye
)

// op is one operation to replay (or, for a read, to apply to a copy).
type op struct {
	kind     opKind
	at       int64 // Unix ms; 0 for settings
	device   string
	active   bool
	manual   presence.Manual
	text     string
	settings presence.Settings
}

// pendingDevice is what one device did while the store was down: beats
// (the first at first, the last at beat, the last active one at active, 0
// if none), then possibly a bye (0 if none).
type pendingDevice struct {
	id                       string
	first, beat, active, bye int64
}

// pending is what one user did while the store was down.
type pending struct {
	devices     []pendingDevice
	hasStatus   bool
	manual      presence.Manual
	text        string
	statusAt    int64
	hasSettings bool
	settings    presence.Settings
}

func (p *pending) empty() bool {
	return len(p.devices) == 0 && !p.hasStatus && !p.hasSettings
}

// add records o after what p holds. A beat of one device more than
// maxDevices live ones is refused, as the store would refuse it; byes of
// unknown devices beyond twice that are dropped (they change nothing the
// buffer knows of), so one user's record stays small.
func (p *pending) add(o op, maxDevices int) error {
	switch o.kind {
	case opSettings:
		p.hasSettings, p.settings = true, o.settings
		return nil
	case opStatus:
		p.hasStatus, p.manual, p.text, p.statusAt = true, o.manual, o.text, o.at
		return nil
	}
	i := slices.IndexFunc(p.devices, func(d pendingDevice) bool { return d.id == o.device })
	if o.kind == opBye {
		if i >= 0 {
			p.devices[i].bye = max(p.devices[i].bye, o.at)
		} else if len(p.devices) < 2*maxDevices {
			p.devices = append(p.devices, pendingDevice{id: o.device, bye: o.at})
		}
		return nil
	}
	if i < 0 {
		live := 0
		for _, d := range p.devices {
			if d.bye == 0 {
				live++
			}
		}
		if live >= maxDevices {
			return presence.ErrTooManyDevices
		}
		if len(p.devices) >= 2*maxDevices {
			// Devices that said bye make room: the oldest bye is
			// forgotten (that device, if the store holds it, lives out
			// its ttl instead), so a client cycling through new device
			// ids cannot grow one user's record without bound.
			oldest := -1
			for j, d := range p.devices {
				if d.bye != 0 && (oldest < 0 || d.bye < p.devices[oldest].bye) {
					oldest = j
				}
			}
			p.devices = slices.Delete(p.devices, oldest, oldest+1) // live < maxDevices: one said bye
		}
		p.devices = append(p.devices, pendingDevice{id: o.device})
		i = len(p.devices) - 1
	}
	d := &p.devices[i]
	if d.bye != 0 {
		// Beats after a bye start the device afresh; the bye is older
		// than they are, so it adds nothing to last_seen.
		*d = pendingDevice{id: d.id}
	}
	d.beat = max(d.beat, o.at)
	if d.first == 0 || o.at < d.first {
		d.first = o.at
	}
	if o.active {
		d.active = max(d.active, o.at)
	}
	return nil
}

// ops appends to out the operations that replay p, in the order of their
// times (settings first).
//
// The buffer keeps a device's first and last beats only. A status or a bye
// replayed at its own time T would find a device that beat before and
// after T as the store last saw it — possibly dead at T, its beats of the
// outage not replayed yet — and announce a false offline. So each device
// that beat both at or before T and after T gets a beat at T, just before
// the operation (active if it was active at or after T): it was there.
func (p *pending) ops(out []op) []op {
	start := len(out)
	if p.hasSettings {
		out = append(out, op{kind: opSettings, settings: p.settings})
	}
	for _, d := range p.devices {
		if d.active > 0 {
			out = append(out, op{kind: opBeat, at: d.active, device: d.id, active: true})
		}
		if d.beat > d.active {
			out = append(out, op{kind: opBeat, at: d.beat, device: d.id})
		}
		if d.bye > 0 {
			out = append(out, op{kind: opBye, at: d.bye, device: d.id})
			out = p.bridge(out, d.bye)
		}
	}
	if p.hasStatus {
		out = append(out, op{kind: opStatus, at: p.statusAt, manual: p.manual, text: p.text})
		out = p.bridge(out, p.statusAt)
	}
	slices.SortStableFunc(out[start:], func(a, b op) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.kind, b.kind)
	})
	return out
}

// deviceOps appends to out each device's last active beat, last beat and
// bye, unordered, without the bridging beats of ops: what a read of the
// user ends with depends on these only (a bridging beat is older than its
// device's last beat), and a user's bridges grow with the square of their
// devices.
func (p *pending) deviceOps(out []op) []op {
	for _, d := range p.devices {
		if d.active > 0 {
			out = append(out, op{kind: opBeat, at: d.active, device: d.id, active: true})
		}
		if d.beat > d.active {
			out = append(out, op{kind: opBeat, at: d.beat, device: d.id})
		}
		if d.bye > 0 {
			out = append(out, op{kind: opBye, at: d.bye, device: d.id})
		}
	}
	return out
}

// bridge appends a beat at T of every device that beat both at or before
// T and after it (see ops).
func (p *pending) bridge(out []op, at int64) []op {
	for _, d := range p.devices {
		if d.first != 0 && d.first <= at && at < d.beat {
			out = append(out, op{kind: opBeat, at: at, device: d.id, active: d.active >= at})
		}
	}
	return out
}

func (t *Tracker) bufShard(user string) *bufShard {
	return &t.buf[maphash.String(t.lockSeed, user)%bufShards]
}

// buffer records o for user unless the store is up. It reports whether o
// was taken (recorded, or refused with the returned error). While the
// buffer is replayed only users still in it take operations, so that
// theirs stay behind the older ones; the others go to the store.
func (t *Tracker) buffer(user string, o op) (bool, error) {
	sh := t.bufShard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	st := t.link.stateFor(user) // under the lock: see replay
	if st == stateUp {
		return false, nil
	}
	p := sh.users[user]
	if p == nil {
		if st != stateDown {
			return false, nil
		}
		if t.buffered.Load() >= int64(t.maxBuffered) {
			return true, ErrUnavailable
		}
		if sh.users == nil {
			sh.users = make(map[string]*pending)
		}
		p = &pending{}
		sh.users[user] = p
		t.buffered.Add(1)
	}
	return true, p.add(o, t.rules.MaxDevices)
}

// bufferedOps returns a copy of the operations buffered for user, nil if none.
func (t *Tracker) bufferedOps(user string) []op {
	sh := t.bufShard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if p := sh.users[user]; p != nil {
		return p.ops(nil)
	}
	return nil
}

// bufferedDevices appends the last beats and byes of the devices buffered
// for user to out (pending.deviceOps).
func (t *Tracker) bufferedDevices(user string, out []op) []op {
	sh := t.bufShard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if p := sh.users[user]; p != nil {
		return p.deviceOps(out)
	}
	return out
}

// probe asks the store whether it answers, with Ping if it has one.
func (t *Tracker) probe(ctx context.Context) error {
	b := t.link.bound(ctx)
	defer t.link.release(b)
	if p := t.link.can.pinger; p != nil {
		return p.Ping(b.ctx)
	}
	var s [1]presence.Snapshot
	return t.link.store.Get(b.ctx, t.Now(), []string{"\x00probe"}, s[:])
}

// recover probes a store that is down and, if it answers, replays the
// buffer and marks it up. Run calls it every ProbeInterval while down.
func (t *Tracker) recover(ctx context.Context) {
	if !t.link.down() || t.probe(ctx) != nil {
		return
	}
	if !t.link.beginReplay() {
		return
	}
	n := t.buffered.Load()
	// A store that came back empty lost its floor: raise it before any
	// replayed user is loaded or read (resetFloor checks first).
	if t.link.can.floorer != nil {
		if err := t.resetFloor(ctx); err != nil {
			t.link.replayFailed()
			return
		}
	}
	if err := t.replay(ctx, -1); err != nil {
		t.link.replayFailed()
		if ctx.Err() == nil {
			t.log.Warn("replay of the outage buffer failed; will retry", "err", err)
		}
		return
	}
	// Sweeps wait RecoverGrace from now (see Sweep).
	if t.link.recovered() {
		t.log.Info("state store is back; outage buffer replayed", "users", n)
		// What the devices this node holds did meanwhile (claims,
		// releases) goes to the store now, before anyone resyncs; and
		// what it wrote just before the outage, which a failover may
		// have lost, again.
		t.tickLease(ctx) // a lease taken over meanwhile is found before anything is claimed under it
		t.redoOwned(ctx, t.link.downAt.Load())
		t.syncOwned(ctx)
		if t.onRecover != nil {
			t.onRecover()
		}
	}
}

// replayWorkers replay the buffer's shards in parallel (each a share of
// the shards, so one user is replayed by one goroutine).
const replayWorkers = 8

var errReplayAborted = errors.New("replay aborted: the store is down again")

// replay applies every buffered user's operations to the store through
// the tracker's own paths (ErrNotLoaded → load included), with each
// operation's own time as now, and publishes the changes. A user stays in
// the buffer while it is replayed: operations arriving meanwhile are added
// there and replayed after the older ones. On a failure the user's
// operations go back in front of the newer ones and replay stops. part is
// the part of a Partitioned store being replayed (its users only), or -1
// for the whole store (the users of every part that is up).
func (t *Tracker) replay(ctx context.Context, part int) error {
	// The state is stateReplaying before any shard is read: buffer checks
	// the state under the shard lock, so no new user can enter a shard
	// after replay has listed it.
	var wg sync.WaitGroup
	errs := make([]error, replayWorkers)
	for w := range replayWorkers {
		wg.Go(func() {
			for i := w; i < bufShards; i += replayWorkers {
				if err := t.replayShard(ctx, &t.buf[i], part); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (t *Tracker) replayShard(ctx context.Context, sh *bufShard, part int) error {
	sh.mu.Lock()
	users := make([]string, 0, len(sh.users))
	for u := range sh.users {
		switch {
		case part >= 0 && t.link.parts.of(u) != part:
		case part < 0 && !t.link.partUp(u): // its part is down: replayed when it answers
		default:
			users = append(users, u)
		}
	}
	sh.mu.Unlock()
	replaying := func() bool {
		if part >= 0 {
			return t.link.parts.replaying(part) && t.link.up()
		}
		return t.link.replaying()
	}
	var ops []op
	for _, u := range users {
		if !replaying() || ctx.Err() != nil {
			return errReplayAborted
		}
		var err error
		if ops, err = t.replayUser(ctx, sh, u, ops[:0]); err != nil {
			if part < 0 && !t.link.partUp(u) {
				continue // its part went down: it stays buffered until that part answers
			}
			return err
		}
	}
	return nil
}

func (t *Tracker) replayUser(ctx context.Context, sh *bufShard, user string, ops []op) ([]op, error) {
	sh.mu.Lock()
	p := sh.users[user]
	batch := *p
	*p = pending{}
	sh.mu.Unlock()
	// The newest change the replay made that everyone sees, and the
	// newest one only the user sees (an invisible user's text) if it came
	// after: each goes to different watchers.
	var last, self presence.Change
	for {
		ops = batch.ops(ops[:0])
		for _, o := range ops {
			ch, err := t.replayOp(ctx, user, o)
			if err != nil {
				sh.mu.Lock()
				newer := p.ops(nil)
				*p = batch
				for _, o := range newer {
					_ = p.add(o, t.rules.MaxDevices) // the newer ones were accepted once
				}
				sh.mu.Unlock()
				t.publishIfTrue(ctx, last, self)
				return ops, fmt.Errorf("replay of %q: %w", user, err)
			}
			switch {
			case ch.Changed && ch.Event.SelfOnly:
				self = ch
			case ch.Changed:
				last, self = ch, presence.Change{}
			}
		}
		sh.mu.Lock()
		if p.empty() {
			delete(sh.users, user)
			t.buffered.Add(-1)
			t.replayed.Add(1)
			sh.mu.Unlock()
			t.publishIfTrue(ctx, last, self)
			return ops, nil
		}
		batch = *p
		*p = pending{}
		sh.mu.Unlock()
	}
}

// publishIfTrue publishes the last change a user's replay made, if it is
// still what the user shows now. The changes of a replay happened at the
// times of the outage: the ones before the last are history (each event
// carries the whole state, so the last says it all), and the last itself
// may be over — a user who came and went during the outage was online
// then, not now, and announcing it would show them online until the next
// sweep. Such a user's state is settled by the sweeps that resume after
// RecoverGrace (an offline that a watcher already shows is harmless).
// self, if a change, is the newest change only the user sees that came
// after ch (an invisible user's text): it is published after ch, if the
// user still has that text.
func (t *Tracker) publishIfTrue(ctx context.Context, ch, self presence.Change) {
	if !ch.Changed && !self.Changed {
		return
	}
	user := ch.Event.UserID
	if !ch.Changed {
		user = self.Event.UserID
	}
	var s [1]presence.Snapshot
	b := t.link.bound(ctx)
	err := t.link.store.Get(b.ctx, t.Now(), []string{user}, s[:])
	t.link.release(b)
	if err != nil || !s[0].Known {
		t.staleReplays.Add(1)
		return
	}
	if pubText, _ := s[0].Public(); ch.Changed && (s[0].Status.Public() != ch.Event.Status || pubText != ch.Event.Text) {
		t.staleReplays.Add(1)
	} else {
		t.emit(&ch)
	}
	if self.Changed && s[0].Text != self.Event.SelfText {
		t.staleReplays.Add(1)
	} else {
		t.emit(&self)
	}
}

// replayOp applies one buffered operation and returns its change. A
// refusal by the rules (too many devices) drops it, as it would have been
// dropped at the time.
func (t *Tracker) replayOp(ctx context.Context, user string, o op) (presence.Change, error) {
	var ch presence.Change
	var err error
	switch o.kind {
	case opSettings:
		ch, err = t.applySettings(ctx, t.Now(), user, &o.settings)
	case opBeat:
		ch, err = t.applyBeat(ctx, o.at, user, o.device, o.active)
	case opBye:
		ch, err = t.applyBye(ctx, o.at, user, o.device)
	case opStatus:
		ch, err = t.applyStatus(ctx, o.at, user, o.manual, o.text)
	}
	if err != nil && domainError(err) {
		t.log.Warn("buffered operation refused on replay", "user", user, "err", err)
		return presence.Change{}, nil
	}
	return ch, err
}

// Get fills out[i] with the state of ids[i] at now, with the semantics of
// Store.Get, so that readers may use the tracker as their States. While
// the store answers (up, or its outage buffer being replayed: a read then
// may miss operations not yet replayed) it is the store's Get. While the
// store is down, or when the Get fails for it, it answers from what this node knows (a degraded read,
// counted in Stats.DegradedReads): each user's durable profile (with any
// checkpoint not yet durable) and, for users with operations in this
// node's outage buffer, those operations applied to it by the rules of
// presence.User — so a user beating on this node is online (or shows their
// manual status; invisible stays invisible), last_seen is the later of the
// durable and the buffered one, and the settings are the durable ones or
// the buffered ones. What the other nodes hold of these users' devices
// (Config.Peers: the sockets they own, their outage buffers) is applied
// too, so a user beating only on another node reads online as well; a
// user whose devices no node holds in memory (an HTTP device that has not
// beaten since the store went down) reads as their durable profile. If the
// durable store fails too, Get fails: it never answers with settings it
// does not know.
func (t *Tracker) Get(ctx context.Context, now int64, ids []string, out []presence.Snapshot) error {
	return t.get(ctx, now, ids, out, true)
}

// get is Get; askPeers false reads degraded without asking the other
// nodes (a read of settings, which never come from them).
func (t *Tracker) get(ctx context.Context, now int64, ids []string, out []presence.Snapshot, askPeers bool) error {
	if t.link.partsDown() && !t.link.down() {
		// The users of a part that is down are read degraded, as every
		// user while the whole store is down: the store would make the
		// read wait StoreTimeout, or — its master back, the part not
		// replayed yet — miss their buffered operations.
		var down, up []int
		for i, id := range ids {
			if t.link.partDown(id) {
				down = append(down, i)
			} else {
				up = append(up, i)
			}
		}
		if len(down) > 0 {
			return t.getSplit(ctx, now, ids, out, askPeers, down, up)
		}
	}
	return t.getAll(ctx, now, ids, out, askPeers)
}

// getSplit is get of ids whose users at down have their part down: those
// are read degraded, the users at up as get reads them.
func (t *Tracker) getSplit(ctx context.Context, now int64, ids []string, out []presence.Snapshot, askPeers bool, down, up []int) error {
	if len(up) > 0 {
		err := readAt(ids, out, up, func(sub []string, got []presence.Snapshot) error {
			return t.getAll(ctx, now, sub, got, askPeers)
		})
		if err != nil {
			return err
		}
	}
	t.degradedReads.Add(1)
	return readAt(ids, out, down, func(sub []string, got []presence.Snapshot) error {
		return t.degradedGet(ctx, now, sub, got, askPeers)
	})
}

// readAt calls read for the ids at the indexes idx and puts its answers at
// those places of out.
func readAt(ids []string, out []presence.Snapshot, idx []int, read func(sub []string, got []presence.Snapshot) error) error {
	sub := make([]string, len(idx))
	for j, i := range idx {
		sub[j] = ids[i]
	}
	got := make([]presence.Snapshot, len(idx))
	if err := read(sub, got); err != nil {
		return err
	}
	for j, i := range idx {
		out[i] = got[j]
	}
	return nil
}

// getAll is get asking the store for every id (unless it is down).
func (t *Tracker) getAll(ctx context.Context, now int64, ids []string, out []presence.Snapshot, askPeers bool) error {
	if !t.link.down() {
		b := t.link.bound(ctx)
		err := t.link.store.Get(b.ctx, now, ids, out)
		t.link.release(b)
		var pe *PartialError
		if errors.As(err, &pe) && ctx.Err() == nil {
			// Part of the store answered (a Cluster master is down):
			// only the users it did not answer for are read degraded.
			t.degradedReads.Add(1)
			return readAt(ids, out, pe.Failed, func(sub []string, got []presence.Snapshot) error {
				return t.degradedGet(ctx, now, sub, got, askPeers)
			})
		}
		if t.link.parts != nil && len(ids) > 0 && err != nil && ctx.Err() == nil && !errors.Is(err, ErrNotLoaded) && !errors.Is(err, ErrStoreReset) {
			// Nothing answered for these users: with a Partitioned store
			// that is an outage of some of their parts (a read of one
			// user whose master is down), not of the store; sweeps tell
			// the store's.
			t.link.partsFailedWhole(ids, err)
		} else if err = t.link.check(ctx, err); !errors.Is(err, errOutage) {
			return err
		}
	}
	t.degradedReads.Add(1)
	return t.degradedGet(ctx, now, ids, out, askPeers)
}

func (t *Tracker) degradedGet(ctx context.Context, now int64, ids []string, out []presence.Snapshot, askPeers bool) error {
	first := make(map[string]int, len(ids)) // id → its first index
	for i, id := range ids {
		out[i] = presence.Snapshot{UserID: id}
		if _, ok := first[id]; !ok {
			first[id] = i
		}
	}
	profiles := make([]presence.Profile, len(ids))
	have := make([]bool, len(ids))
	err := t.profiles(ctx, ids, func(p *presence.Profile) {
		i := first[p.UserID]
		profiles[i], have[i] = *p, true
		profiles[i].Raise(0, 0) // a public version above the version counts as the version
	}, false)
	if err != nil {
		return fmt.Errorf("tracker: state store down and durable profiles unavailable: %w", err)
	}
	var peers map[string][]op
	var peerSnaps map[string]presence.Snapshot
	if askPeers {
		peers, peerSnaps = t.peerOps(ctx, now, ids)
	}
	for i, id := range ids {
		if j := first[id]; j != i {
			out[i] = out[j]
			continue
		}
		ops := t.ownedOps(now, id, t.bufferedOps(id))
		if ps, ok := peerSnaps[id]; ok {
			// A peer read the user in the store: that is the truth but
			// for what this node holds of them (withPeerSnapshot).
			local := len(ops) > 0
			defer func() { out[i] = withPeerSnapshot(out[i], ps, local) }()
		}
		ops = append(ops, peers[id]...)
		if ops == nil {
			if have[i] {
				out[i] = presence.SnapshotFromProfile(&profiles[i])
			}
			continue
		}
		sortOps(ops) // this node's owned devices and the peers' signs came after the buffer's
		profiles[i].UserID = id
		u := presence.NewUser(profiles[i])
		for _, o := range ops {
			switch o.kind {
			case opSettings:
				u.Settings = o.settings
			case opBeat:
				_, _ = u.Beat(&t.rules, o.at, o.device, o.active) // a refused beat was refused when buffered
			case opBye:
				u.Bye(&t.rules, o.at, o.device)
			case opStatus:
				u.SetStatus(&t.rules, o.at, o.manual, o.text)
			}
		}
		u.Snapshot(&t.rules, now, &out[i])
		// No version is stamped here: the profile's, and its public one
		// (an invisible user's frozen face) unless the operations made a
		// change everyone sees.
		_, pub := profiles[i].Public()
		if out[i].PubVersion > profiles[i].Version {
			pub = profiles[i].Version
		}
		out[i].Version, out[i].PubVersion = profiles[i].Version, pub
	}
	return nil
}

// recoverParts probes every part that is down and, for each that answers,
// replays its users' buffer and marks it up. Run calls it every
// ProbeInterval while the store as a whole is up.
func (t *Tracker) recoverParts(ctx context.Context) {
	ps := t.link.parts
	if ps == nil || ps.down.Load() == 0 || !t.link.up() {
		return
	}
	downs := ps.downs()
	errs := t.link.pingParts(ctx, downs)
	recovered, since := false, int64(0)
	for i, p := range downs {
		if errs[i] != nil || !ps.beginReplay(p) {
			continue
		}
		if err := t.replay(ctx, p); err != nil {
			ps.replayFailed(p)
			if ctx.Err() == nil {
				t.log.Warn("replay of a part's outage buffer failed; will retry", "part", p, "err", err)
			}
			continue
		}
		ok, at, last := ps.recovered(p, t.Now())
		if !ok {
			continue
		}
		if last {
			t.log.Info("every part of the state store is back; their users' buffer replayed", "outages", ps.outages.Load())
		}
		if !recovered || at < since {
			since = at
		}
		recovered = true
	}
	if recovered {
		// As after an outage of the whole store: what this node's devices
		// did meanwhile, and what a failover may have lost, goes to the
		// store again; watchers are resynced.
		t.redoOwned(ctx, since)
		t.syncOwned(ctx)
		if t.onRecover != nil {
			t.onRecover()
		}
	}
}

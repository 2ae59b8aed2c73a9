package tracker

import (
	"cmp"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/presenced/presenced/internal/presence"
)

// opKind names a buffered operation.
type opKind uint8

const (
	opSettings opKind = iota // first at equal times: events then carry them
	opBeat
	opStatus
	opBye
)

// op is one operation of a user: to apply to the store, to keep for a
// replay, or, for a read, to apply to a copy.
type op struct {
	kind     opKind
	at       int64 // Unix ms; 0 for settings
	device   string
	active   bool
	manual   presence.Manual
	text     string
	settings presence.Settings
}

// sortOps orders operations gathered from several places by time,
// settings first and byes after beats at equal times (as pending.ops does).
func sortOps(ops []op) {
	slices.SortStableFunc(ops, func(a, b op) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.kind, b.kind)
	})
}

// pendingDevice is what one device did while the store did not hear of
// it: beats (the first at first, the last at beat, the last active one at
// active, 0 if none), then possibly a bye (0 if none).
type pendingDevice struct {
	id                       string
	first, beat, active, bye int64
}

// ops appends the device's last active beat, last beat and bye, in that
// order, each only if it happened.
func (d *pendingDevice) ops(out []op) []op {
	if d.active > 0 {
		out = append(out, op{kind: opBeat, at: d.active, device: d.id, active: true})
	}
	if d.beat > d.active {
		out = append(out, op{kind: opBeat, at: d.beat, device: d.id})
	}
	if d.bye > 0 {
		out = append(out, op{kind: opBye, at: d.bye, device: d.id})
	}
	return out
}

// pending is what one user did while the store did not hear of it: per
// device the latest operation, the latest manual status and the latest
// settings.
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
	for i := range p.devices {
		d := &p.devices[i]
		out = d.ops(out)
		if d.bye > 0 {
			out = p.bridge(out, d.bye)
		}
	}
	if p.hasStatus {
		out = append(out, op{kind: opStatus, at: p.statusAt, manual: p.manual, text: p.text})
		out = p.bridge(out, p.statusAt)
	}
	sortOps(out[start:])
	return out
}

// deviceOps appends to out each device's last active beat, last beat and
// bye, unordered, without the bridging beats of ops: what a read of the
// user ends with depends on these only (a bridging beat is older than its
// device's last beat), and a user's bridges grow with the square of their
// devices.
func (p *pending) deviceOps(out []op) []op {
	for i := range p.devices {
		out = p.devices[i].ops(out)
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

// userBuffer holds, per user, what the user did that the store has not
// heard of yet, in bufShards shards. The outage buffer and the cold
// buffer are one each.
type userBuffer struct {
	seed       maphash.Seed
	max        int // users it takes
	maxDevices int
	n          atomic.Int64 // users in it
	shards     [bufShards]bufShard
}

const bufShards = 64

type bufShard struct {
	mu    sync.Mutex          // guards users and every *pending in it
	users map[string]*pending // user → what they did
	_     [48]byte            // a shard per cache line
}

// init readies b for at most maxUsers users of at most maxDevices live
// devices each.
func (b *userBuffer) init(maxUsers, maxDevices int) {
	b.seed, b.max, b.maxDevices = maphash.MakeSeed(), maxUsers, maxDevices
}

func (b *userBuffer) shard(user string) *bufShard {
	return &b.shards[maphash.String(b.seed, user)%bufShards]
}

// addLocked records o for user, whose shard sh the caller holds locked.
// A user not in the buffer enters it if enter says so, and only while
// fewer than max users are in it (full is returned otherwise). It reports
// whether o was taken: recorded, or refused with the returned error.
func (b *userBuffer) addLocked(sh *bufShard, user string, o op, enter bool, full error) (bool, error) {
	p := sh.users[user]
	if p == nil {
		if !enter {
			return false, nil
		}
		if b.n.Load() >= int64(b.max) {
			return true, full
		}
		if sh.users == nil {
			sh.users = make(map[string]*pending)
		}
		p = &pending{}
		sh.users[user] = p
		b.n.Add(1)
	}
	return true, p.add(o, b.maxDevices)
}

// opsOf returns a copy of the operations buffered for user, in the order
// of a replay; nil if none.
func (b *userBuffer) opsOf(user string) []op {
	sh := b.shard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if p := sh.users[user]; p != nil {
		return p.ops(nil)
	}
	return nil
}

// devicesOf appends the last beats and byes of the devices buffered for
// user to out (pending.deviceOps).
func (b *userBuffer) devicesOf(user string, out []op) []op {
	sh := b.shard(user)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if p := sh.users[user]; p != nil {
		return p.deviceOps(out)
	}
	return out
}

// usersIn appends the users of sh that keep names (all if keep is nil).
func (b *userBuffer) usersIn(sh *bufShard, keep func(user string) bool, out []string) []string {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for u := range sh.users {
		if keep == nil || keep(u) {
			out = append(out, u)
		}
	}
	return out
}

// drain applies what user did with apply, batch by batch — operations
// that arrive meanwhile wait in the buffer behind the batch, and form the
// next one — until nothing is left; then the user leaves the buffer. On
// a failure the batch goes back in front of the newer operations, and
// apply's error is returned. It reports whether user was in the buffer.
func (b *userBuffer) drain(sh *bufShard, user string, apply func(batch *pending) error) (bool, error) {
	sh.mu.Lock()
	p := sh.users[user]
	if p == nil {
		sh.mu.Unlock()
		return false, nil
	}
	batch := *p
	*p = pending{}
	sh.mu.Unlock()
	for {
		if err := apply(&batch); err != nil {
			sh.mu.Lock()
			newer := p.ops(nil)
			*p = batch
			for _, o := range newer {
				_ = p.add(o, b.maxDevices) // the newer ones were accepted once
			}
			sh.mu.Unlock()
			return true, err
		}
		sh.mu.Lock()
		if p.empty() {
			delete(sh.users, user)
			b.n.Add(-1)
			sh.mu.Unlock()
			return true, nil
		}
		batch = *p
		*p = pending{}
		sh.mu.Unlock()
	}
}

package tracker

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/presenced/presenced/internal/presence"
)

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
	err := t.cps.profiles(ctx, ids, func(p *presence.Profile) {
		i := first[p.UserID]
		profiles[i], have[i] = *p, true
		profiles[i].Raise(0, 0) // a public version above the version counts as the version
	}, false)
	if err != nil {
		return fmt.Errorf("tracker: state store down and durable profiles unavailable: %w", err)
	}
	var peers map[string][]op
	var peerSnaps map[string]presence.Snapshot
	if askPeers && t.peers != nil {
		peers, peerSnaps = t.peers.ask(ctx, now, ids, !t.link.up())
	}
	for i, id := range ids {
		if j := first[id]; j != i {
			out[i] = out[j]
			continue
		}
		ops := t.outage.heldOps(id)
		if t.owned != nil {
			ops = t.owned.opsOf(now, id, ops)
		}
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

// Settings returns a user's privacy settings (while the store is down:
// from the durable store and the outage buffer).
func (t *Tracker) Settings(ctx context.Context, user string) (presence.Settings, error) {
	if t.link.upFor(user) {
		if _, err := t.apply.ensure(ctx, user); err != nil && !errors.Is(err, errOutage) {
			return presence.Settings{}, err
		}
	}
	var s [1]presence.Snapshot
	if err := t.get(ctx, t.Now(), []string{user}, s[:], false); err != nil {
		return presence.Settings{}, err
	}
	return s[0].Settings, nil
}

// Debug returns the hot state of a user and its next deadline.
func (t *Tracker) Debug(ctx context.Context, user string) (presence.User, int64, bool, error) {
	b := t.link.bound(ctx)
	defer t.link.release(b)
	u, deadline, ok, err := t.link.store.Debug(b.ctx, user)
	return u, deadline, ok, t.link.check(ctx, err)
}

// Signs appends to out what this node holds of ids' devices apart from the
// store at now — the beats of the devices whose sockets it owns, the beats
// and byes in its outage buffer — and returns it: what it answers a peer
// that reads those users degraded. Statuses and settings are not signs: a
// node writes them to the durable store before anything else, and a
// degraded read starts from there.
func (t *Tracker) Signs(now int64, ids []string, out []DeviceSign) []DeviceSign {
	var ops []op
	for _, id := range ids {
		ops = t.outage.heldDevices(id, ops[:0])
		if t.owned != nil {
			ops = t.owned.opsOf(now, id, ops)
		}
		for _, o := range ops {
			switch o.kind {
			case opBeat:
				out = append(out, DeviceSign{User: id, Device: o.device, At: o.at, Active: o.active})
			case opBye:
				out = append(out, DeviceSign{User: id, Device: o.device, At: o.at, Bye: true})
			}
		}
	}
	return out
}

// StoreSnapshots appends to out the users of ids that this node's store
// holds and answers for now, as Get reads them (its outage buffer aside):
// what it answers a peer that cannot read the store itself. Nothing while
// the store, or a user's part, is down here too; the read is bounded by
// peerStoreTimeout, so that it fits in the asker's wait.
func (t *Tracker) StoreSnapshots(ctx context.Context, now int64, ids []string, out []presence.Snapshot) []presence.Snapshot {
	if !t.link.up() || len(ids) == 0 {
		return out
	}
	// Not the users of a part that is down here too: the read would wait
	// on it.
	ids = slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return !t.link.partUp(id) })
	if len(ids) == 0 {
		return out
	}
	ctx, cancel := context.WithTimeout(ctx, min(t.link.timeout, peerStoreTimeout))
	defer cancel()
	snaps := make([]presence.Snapshot, len(ids))
	err := t.link.store.Get(ctx, now, ids, snaps)
	var failed []int
	var pe *PartialError
	switch {
	case errors.As(err, &pe):
		failed = pe.Failed
	case err != nil:
		return out
	}
	for i := range snaps {
		if snaps[i].Known && !slices.Contains(failed, i) && t.link.partUp(ids[i]) {
			snaps[i].UserID = ids[i]
			out = append(out, snaps[i])
		}
	}
	return out
}

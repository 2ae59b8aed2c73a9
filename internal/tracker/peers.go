package tracker

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/presenced/presenced/internal/presence"
)

// Peers asks the other nodes of a deployment what they hold in memory of
// users' devices. A degraded read (the store is down, or the part of it
// that holds the users) asks them: without it a node reads every user who
// beats only on other nodes as offline, although their devices live (the
// nodes that hold their sockets keep them alive; their HTTP beats wait in
// those nodes' outage buffers).
//
// Ask returns what every node that answered in time said. It must bound
// its own wait: a node that does not answer is read without; an error
// means no node could be asked (the read goes on without them).
//
// withStore asks the nodes whose store answers to read the users there
// too (Answers.Snapshots): a node that cannot reach the store at all asks
// so; a read degraded for part of the store (a Cluster master down, for
// every node alike) does not — that read would wait on the same master.
type Peers interface {
	Ask(ctx context.Context, ids []string, withStore bool) (Answers, error)
}

// Answers are what the other nodes said of the users a degraded read
// asked about.
type Answers struct {
	Signs []DeviceSign
	// Snapshots are users as a node whose store answers for them read
	// them there (StoreSnapshots): when only this node is cut off from
	// Redis, the truth it cannot read itself — the HTTP beats that went
	// to Redis through the other nodes included.
	Snapshots []presence.Snapshot
}

// DeviceSign is one thing a node holds in memory of a user's device apart
// from the store: a beat (a socket it owns, a beat in its outage buffer)
// or a bye (in its outage buffer).
type DeviceSign struct {
	User, Device string
	At           int64 // Unix ms
	Active       bool  // a beat of the user's activity
	Bye          bool  // a bye at At, not a beat
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
		ops = t.ownedOps(now, id, t.bufferedDevices(id, ops[:0]))
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

// peerStoreTimeout bounds a store read made for a peer (the peer waits
// 250 ms in all).
const peerStoreTimeout = 150 * time.Millisecond

// peerOps asks the peers about ids and returns their signs as operations
// per id, each list in the order to apply, and the newest snapshot a peer
// read of each id in its store. Nil without peers or answers.
func (t *Tracker) peerOps(ctx context.Context, now int64, ids []string) (map[string][]op, map[string]presence.Snapshot) {
	if t.peers == nil || len(ids) == 0 {
		return nil, nil
	}
	ans, err := t.peers.Ask(ctx, ids, !t.link.up())
	if err != nil {
		t.peerAskErrors.Add(1)
		return nil, nil
	}
	var snaps map[string]presence.Snapshot
	for _, s := range ans.Snapshots {
		if snaps == nil {
			snaps = make(map[string]presence.Snapshot)
		}
		if have, ok := snaps[s.UserID]; !ok || s.Version > have.Version {
			snaps[s.UserID] = s
		}
	}
	t.peerSnapshots.Add(uint64(len(ans.Snapshots)))
	signs := ans.Signs
	if len(signs) == 0 {
		return nil, snaps
	}
	byUser := make(map[string][]op)
	for _, s := range signs {
		at := min(s.At, now) // another node's clock ahead of ours shows no last_seen in the future
		o := op{kind: opBeat, at: at, device: s.Device, active: s.Active}
		if s.Bye {
			o = op{kind: opBye, at: at, device: s.Device}
		}
		byUser[s.User] = append(byUser[s.User], o)
	}
	t.peerSigns.Add(uint64(len(signs)))
	return byUser, snaps
}

// withPeerSnapshot returns what a degraded read answers of a user it
// computed as s (durable profile, this node's and the peers' signs) when
// a peer read the user in the store as ps: the store's truth, unless this
// node holds operations of the user (local: its buffer, the sockets it
// owns) that no store has seen — then s, unless s shows the user gone and
// the store present. Never a version below either.
func withPeerSnapshot(s, ps presence.Snapshot, local bool) presence.Snapshot {
	// The public faces as they are, before a version is raised under them.
	s.PubText, s.PubVersion = s.Public()
	ps.PubText, ps.PubVersion = ps.Public()
	if local && (s.Status != presence.Offline || ps.Status == presence.Offline) {
		s.Version = max(s.Version, ps.Version)
		return s
	}
	ps.Version = max(ps.Version, s.Version)
	ps.LastSeen = max(ps.LastSeen, s.LastSeen)
	return ps
}

// sortOps orders operations gathered from several nodes by time, settings
// first and byes after beats at equal times (as pending.ops does).
func sortOps(ops []op) {
	slices.SortStableFunc(ops, func(a, b op) int {
		if c := cmp.Compare(a.at, b.at); c != 0 {
			return c
		}
		return cmp.Compare(a.kind, b.kind)
	})
}

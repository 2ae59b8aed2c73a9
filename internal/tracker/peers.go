package tracker

import (
	"context"
	"sync/atomic"
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

// peerStoreTimeout bounds a store read made for a peer (the peer waits
// 250 ms in all).
const peerStoreTimeout = 150 * time.Millisecond

// peerReads ask the other nodes what they hold of users' devices for
// degraded reads (Config.Peers), and count what they said.
type peerReads struct {
	peers     Peers
	signs     atomic.Uint64 // signs of devices the peers gave degraded reads
	snapshots atomic.Uint64 // users the peers read in the store for degraded reads
	askErrors atomic.Uint64 // degraded reads that could ask no peer
}

// ask asks the peers about ids (withStore: to read them in their store
// too) and returns their signs as operations per id, each list in the
// order to apply, and the newest snapshot a peer read of each id in its
// store. Nil without answers.
func (r *peerReads) ask(ctx context.Context, now int64, ids []string, withStore bool) (map[string][]op, map[string]presence.Snapshot) {
	if len(ids) == 0 {
		return nil, nil
	}
	ans, err := r.peers.Ask(ctx, ids, withStore)
	if err != nil {
		r.askErrors.Add(1)
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
	r.snapshots.Add(uint64(len(ans.Snapshots)))
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
	r.signs.Add(uint64(len(signs)))
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

package tracker

import (
	"cmp"
	"context"
	"slices"
)

// Peers asks the other nodes of a deployment what they hold in memory of
// users' devices. A degraded read (the store is down, or the part of it
// that holds the users) asks them: without it a node reads every user who
// beats only on other nodes as offline, although their devices live (the
// nodes that hold their sockets keep them alive; their HTTP beats wait in
// those nodes' outage buffers).
//
// Ask returns the signs every node that answered in time gave. It must
// bound its own wait: a node that does not answer is read without; an
// error means no node could be asked (the read goes on without them).
type Peers interface {
	Ask(ctx context.Context, ids []string) ([]DeviceSign, error)
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

// peerOps asks the peers about ids and returns their signs as operations
// per id, each list in the order to apply. Nil without peers or answers.
func (t *Tracker) peerOps(ctx context.Context, now int64, ids []string) map[string][]op {
	if t.peers == nil || len(ids) == 0 {
		return nil
	}
	signs, err := t.peers.Ask(ctx, ids)
	if err != nil {
		t.peerAskErrors.Add(1)
		return nil
	}
	if len(signs) == 0 {
		return nil
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
	return byUser
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

package app

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/presenced/presenced/internal/httpapi"
	"github.com/presenced/presenced/internal/wire"
)

// adminSource is what the operator page (GET /v1/admin/stats) reads of
// the node: its metrics, and the nodes it knows of — itself, and with
// Redis and NATS the others, through their leases in the store and their
// beacons on NATS.
type adminSource struct {
	a       *App
	name    string
	started time.Time
}

var _ httpapi.Admin = (*adminSource)(nil)

func newAdminSource(a *App) *adminSource {
	name := a.cfg.NodeID
	if name == "" && a.bus != nil {
		name = a.bus.NodeID()
	}
	if name == "" {
		name, _ = os.Hostname()
	}
	return &adminSource{a: a, name: name, started: a.cfg.Clock.Now()}
}

func (s *adminSource) Metrics() (map[string]float64, error) { return s.a.metrics.Values() }

func (s *adminSource) Nodes() []httpapi.AdminNode {
	a := s.a
	started := wire.FormatTime(s.started.UnixMilli())
	self := httpapi.AdminNode{ID: s.name, Lease: a.tracker.LeaseID(), Self: true, Mode: a.cfg.Mode(), Started: &started}
	switch {
	case a.beacon != nil:
		self.Detail = "other nodes are known by their leases in Redis and their beacons on NATS"
	case a.redis != nil:
		self.Detail = "other nodes are known by their leases in Redis"
	case a.cfg.RedisURL == "" && a.cfg.NATSURL == "" && a.cfg.PostgresURL == "":
		self.Detail = "the only node"
	default:
		self.Detail = "other nodes are not known without Redis (leases) and NATS (beacons)"
	}
	nodes := []httpapi.AdminNode{self}

	now := a.cfg.Clock.Now()
	type peer struct {
		node   httpapi.AdminNode
		leased bool // listed in the store
		alive  bool
		since  int64 // renewal first seen (this node's clock)
	}
	byLease := map[uint64]*peer{}
	leases, listed := a.tracker.PeerLeases()
	timeout := a.tracker.LeaseTimeout()
	for _, l := range leases {
		renewed := wire.FormatTime(l.Renewed)
		p := &peer{node: httpapi.AdminNode{Lease: l.ID, LeaseRenewed: &renewed}, leased: true, since: l.Since}
		switch {
		case l.Taken:
			p.node.Health = "taken_over"
			p.node.Detail = "its lease ran out and was taken over: its devices were given back to the ttl"
		case l.Since != 0 && now.UnixMilli()-l.Since < timeout.Milliseconds():
			p.alive = true
		}
		byLease[l.ID] = p
	}
	if a.beacon != nil {
		bt := a.beacon.Timeout()
		for _, n := range a.beacon.Nodes() {
			if n.Lease == self.Lease {
				continue
			}
			p, ok := byLease[n.Lease]
			if !ok {
				p = &peer{node: httpapi.AdminNode{Lease: n.Lease}}
				byLease[n.Lease] = p
			}
			p.node.ID = n.Name
			age := now.Sub(n.Heard).Milliseconds()
			p.node.BeaconAgeMs = &age
			if now.Sub(n.Heard) < bt && p.node.Health == "" {
				p.alive = true
			}
		}
	}
	ids := make([]uint64, 0, len(byLease))
	for id := range byLease {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		p := byLease[id]
		if p.node.Health == "" {
			p.node.Health = "silent"
			if p.alive {
				p.node.Health = "alive"
			}
			p.node.Detail = peerDetail(p.leased, p.since, listed, p.node.BeaconAgeMs, now.UnixMilli())
		}
		nodes = append(nodes, p.node)
	}
	return nodes
}

// peerDetail says how this node knows of another: when it saw its lease
// renewed, when it heard its beacon.
func peerDetail(leased bool, since, listed int64, beaconAge *int64, now int64) string {
	var d string
	switch {
	case !leased:
		d = "no lease in the store (starting, or gone)"
	case since == 0:
		d = "lease listed in the store"
	default:
		d = fmt.Sprintf("lease renewal last seen changing %s ago", time.Duration(now-since)*time.Millisecond)
	}
	if listed != 0 && leased {
		d += fmt.Sprintf(" (store read %s ago)", time.Duration(now-listed)*time.Millisecond)
	}
	if beaconAge != nil {
		d += fmt.Sprintf("; beacon heard %s ago", time.Duration(*beaconAge)*time.Millisecond)
	}
	return d
}

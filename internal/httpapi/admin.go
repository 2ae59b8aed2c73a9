package httpapi

import (
	"encoding/json"
	"net/http"

	"github.com/presenced/presenced/internal/wire"
)

// Admin feeds GET /v1/admin/stats, the numbers of the operator page
// (/admin). Its methods are called on every request and must be safe for
// concurrent use.
type Admin interface {
	// Metrics returns the node's counters and gauges by name, read now
	// (metrics.Registry.Values): the page computes rates from two reads.
	Metrics() (map[string]float64, error)
	// Nodes returns this node (first, Self set) and the other nodes of the
	// deployment it knows of. The server fills this node's Health and
	// Checks from its readiness checks.
	Nodes() []AdminNode
}

// AdminNode is one node of the deployment as this node knows it.
type AdminNode struct {
	ID    string `json:"id"`              // its name (-node-id); empty if unknown
	Lease uint64 `json:"lease,omitempty"` // its lease in the state store (scale-out with Redis)
	Self  bool   `json:"self"`            // the node that answers
	Mode  string `json:"mode,omitempty"`  // its backends (this node only)
	// Health is "ready" or "not_ready" (this node: its readiness checks),
	// "alive" (another node heard from within the lease timeout), "silent"
	// (not heard from: it will be taken over) or "taken_over".
	Health string            `json:"health"`
	Checks map[string]string `json:"checks,omitempty"` // this node: check → "ok" / "unavailable"
	// Detail says in words how this node knows (last renewal, last beacon).
	Detail string `json:"detail"`
	// LeaseRenewed is the node's last lease renewal (its own clock) and
	// BeaconAgeMs how long ago its last beacon was heard; null: unknown.
	LeaseRenewed *string `json:"lease_renewed"`
	BeaconAgeMs  *int64  `json:"beacon_age_ms"`
	Started      *string `json:"started,omitempty"` // this node: when it started
}

type adminStats struct {
	Now     string             `json:"now"`
	NowMs   int64              `json:"now_ms"` // the same, for computing rates
	Nodes   []AdminNode        `json:"nodes"`
	Metrics map[string]float64 `json:"metrics"`
}

// adminStats serves GET /v1/admin/stats: this node's health and the
// other nodes it knows of, and its counters by name. API key only.
func (s *Server) adminStats(w http.ResponseWriter, r *http.Request) error {
	p, err := s.principal(r)
	if err != nil {
		return err
	}
	if err := s.backendOnly(r, p); err != nil {
		return err
	}
	if s.admin == nil {
		return &Error{Status: http.StatusNotFound, Code: "not_found", Message: "this node has no operator statistics"}
	}
	nodes := s.admin.Nodes()
	for i := range nodes {
		if !nodes[i].Self {
			continue
		}
		reason, results := s.runChecks(r.Context())
		nodes[i].Checks = make(map[string]string, len(results))
		for _, c := range results {
			nodes[i].Checks[c.name] = c.state
		}
		switch reason {
		case "":
			nodes[i].Health = "ready"
		default:
			nodes[i].Health = "not_ready"
			nodes[i].Detail = "not ready: " + reason
		}
	}
	values, err := s.admin.Metrics()
	if err != nil {
		// Some collector failed: what was gathered is still shown.
		s.log.Warn("reading metrics for the operator page", "err", err)
	}
	now := s.clock.Now().UnixMilli()
	b, err := json.Marshal(adminStats{Now: wire.FormatTime(now), NowMs: now, Nodes: nodes, Metrics: values})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, append(b, '\n'))
	return nil
}

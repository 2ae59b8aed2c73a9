package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Scenarios that may run across several nodes (rooms, room-interval)
// take -url more than once, as fanout does: the changes on the first
// node, the watchers round-robin on the others. Their -server-pid is a
// list too: one pid for every node (in-process nodes share one), or one
// per -url.

// node is one presenced node of a scenario.
type node struct {
	wsURL    *url.URL // ws://127.x.y.z:port/v1/ws
	httpBase string   // http://127.x.y.z:port
}

// pidList is a repeatable, comma-separated list of pids.
type pidList []int

func (l *pidList) String() string {
	s := make([]string, len(*l))
	for i, p := range *l {
		s[i] = strconv.Itoa(p)
	}
	return strings.Join(s, ",")
}

func (l *pidList) Set(s string) error {
	for p := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 0 {
			return fmt.Errorf("%q: not a pid", p)
		}
		*l = append(*l, n)
	}
	return nil
}

// registerNodes is register for a scenario over one or several nodes:
// -url and -server-pid repeat.
func (b *benchFlags) registerNodes(fs *flag.FlagSet, duration time.Duration, changes, watchers string) {
	b.registerRest(fs, duration)
	b.multi = true
	fs.Var(&b.urls, "url", "presenced node(s), loopback only (ws:// or http://); repeat or comma-separate: "+changes+
		" on the first, "+watchers+" round-robin on the others (default "+defaultURL+")")
	fs.Var(&b.pids, "server-pid", "pid of the server, for its CPU (0: the process listening on the URL's port); with several -url, one for all or one per -url, comma-separated")
}

// checkNodes fills b.nodes (and b.rawURL, b.wsURL, b.httpBase with the
// first node's) from the -url values, for check.
func (b *benchFlags) checkNodes() error {
	var raws []string
	for _, r := range b.urls {
		for p := range strings.SplitSeq(r, ",") {
			if p = strings.TrimSpace(p); p != "" {
				raws = append(raws, p)
			}
		}
	}
	if len(b.urls) == 0 {
		raws = []string{defaultURL}
	}
	if len(raws) == 0 {
		return errors.New("give -url")
	}
	if len(raws) > 16 {
		return fmt.Errorf("%d URLs: at most 16", len(raws))
	}
	b.nodes = b.nodes[:0]
	for _, r := range raws {
		u, base, err := loopbackURL(r)
		if err != nil {
			return err
		}
		b.nodes = append(b.nodes, node{wsURL: u, httpBase: base})
	}
	b.rawURL = raws[0]
	switch {
	case len(b.pids) == 0:
	case len(b.pids) == 1 || len(b.pids) == len(raws):
		b.serverPID = b.pids[0]
	default:
		return fmt.Errorf("-server-pid: %d pids for %d URLs (give one for all, or one per URL)", len(b.pids), len(raws))
	}
	return nil
}

// watcherNodes are the nodes the watchers are spread over: the others
// than the first, or the first when it is the only one.
func (b *benchFlags) watcherNodes() []node {
	if len(b.nodes) > 1 {
		return b.nodes[1:]
	}
	return b.nodes
}

// resolvePIDs returns the pid serving each node, each pid once, the
// first node's first: from -server-pid, else the process listening on
// the node's port.
func (b *benchFlags) resolvePIDs() ([]int, error) {
	if !b.multi || len(b.nodes) <= 1 {
		p, err := b.resolvePID()
		if err != nil {
			return nil, err
		}
		return []int{p}, nil
	}
	var out []int
	seen := make(map[int]bool)
	for i, n := range b.nodes {
		var p int
		switch len(b.pids) {
		case 1:
			p = b.pids[0]
		case len(b.nodes):
			p = b.pids[i]
		}
		if p == 0 {
			port, _ := strconv.Atoi(n.wsURL.Port())
			var err error
			if p, err = listeningPID(port); err != nil {
				return nil, fmt.Errorf("node %s: %w", n.wsURL.Host, err)
			}
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out, nil
}

// nodeURLs are the nodes' URLs (ws://…/v1/ws, or the http:// bases) as a
// result prints them, nil for a single node (whose result says url only,
// as it always did).
func (b *benchFlags) nodeURLs(http bool) []string {
	if len(b.nodes) <= 1 {
		return nil
	}
	out := make([]string, len(b.nodes))
	for i, n := range b.nodes {
		out[i] = n.wsURL.String()
		if http {
			out[i] = n.httpBase
		}
	}
	return out
}

// eachNode prints the cores of each node after their sum: " (0.12 +
// 0.30 + 0.29)", or nothing for one.
func eachNode(cores []float64) string {
	if len(cores) <= 1 {
		return ""
	}
	s := make([]string, len(cores))
	for i, c := range cores {
		s[i] = strconv.FormatFloat(c, 'f', 3, 64)
	}
	return " (" + strings.Join(s, " + ") + ")"
}

package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	wsclient "github.com/presenced/presenced/client"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// Two nodes with a read replica: of every user (-read-replica), bounded
// by default, and bounded to 16 users — fewer than the test reads, so
// that users are evicted and read through again all along. Users change
// in every way a read shows — heartbeats on either node, sockets on node
// 1, second devices, statuses and texts, invisibility, byes, settings,
// contact lists, expiry — and node 2's seed batch read (GET
// /presence/batch) and full read (POST /v1/presence/batch), both
// answered by its replica, must show, for an anonymous viewer and for
// one with contacts, exactly what a third node without a replica reads
// in Redis (the full view's last_seen of a present user aside: the
// replica's is the moment of the read). Then NATS stops: the replica refuses (the reads go to
// Redis and stay right while node 1 keeps changing users), and once NATS
// is back it is filled (or emptied) again and answers, right.
func TestReadReplicaAcrossNodes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		flags []string
	}{
		{"every user", []string{"-read-replica"}},
		{"bounded by default", nil},
		{"bounded to 16", []string{"-read-replica-users", "16"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testReadReplicaAcrossNodes(t, c.flags...)
		})
	}
}

func testReadReplicaAcrossNodes(t *testing.T, flags ...string) {
	b := newBackends(t)
	nodes := b.nodes(t, 2, flags...)
	n1, n2 := nodes[0], nodes[1]
	truth := b.node(t, 3, "-read-replica-users", "-1")
	const users = 40
	ids := make([]string, users, users+1)
	for i := range ids {
		ids[i] = fmt.Sprint("r", i)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	var socks []*wsclient.Client
	for i := range 4 { // r0…r3 hold sockets on node 1: devices node 1 owns
		socks = append(socks, dial(t, n1, ids[i], "sock"))
	}
	for _, id := range ids[4:] {
		nodes[rng.IntN(2)].heartbeat(apiKey, id, "http")
	}
	// The viewer reads itself too: invisible, which only it may see (the
	// replica holds public statuses; its own comes from Redis).
	socks = append(socks, dial(t, n1, "v", "sock"))
	n1.call("POST", "/v1/status", apiKey, map[string]any{"user_id": "v", "status": "invisible"})
	ids = append(ids, "v")
	// Some users show their status to contacts only; the viewer "v" is a
	// contact of some of them.
	for i := 0; i < users; i += 5 {
		n1.call("PUT", "/v1/users/"+ids[i]+"/settings", apiKey, map[string]string{"status_visibility": "contacts", "last_seen_visibility": "contacts"})
		if i%10 == 0 {
			n1.call("PUT", "/v1/users/"+ids[i]+"/contacts", apiKey, map[string][]string{"contacts": {"v"}})
		}
	}
	change := func(n *proc, rounds int) {
		for range rounds {
			id := ids[rng.IntN(users)]
			switch rng.IntN(6) {
			case 0, 1:
				n.heartbeat(apiKey, id, "http")
			case 2:
				st := []string{"online", "away", "busy", "invisible"}[rng.IntN(4)]
				body := map[string]any{"user_id": id, "status": st}
				if rng.IntN(2) == 0 {
					body["text"] = fmt.Sprint("text ", rng.IntN(3))
				}
				n.call("POST", "/v1/status", apiKey, body)
			case 3:
				n.call("POST", "/v1/bye", apiKey, map[string]any{"user_id": id, "device_id": "http"})
			case 4:
				vis := []string{"everyone", "contacts", "nobody"}[rng.IntN(3)]
				n.call("PUT", "/v1/users/"+id+"/settings", apiKey, map[string]string{"status_visibility": vis, "last_seen_visibility": vis})
			case 5:
				n.heartbeat(apiKey, id, "other")
			}
		}
	}
	served := func() float64 {
		return metric(t, n2.server, `presenced_replica_reads_total{source="replica"}`) +
			metric(t, n2.server, `presenced_replica_full_reads_total{source="replica"}`)
	}
	refused := func() float64 { return metric(t, n2.server, `presenced_replica_reads_total{source="store"}`) }

	// agree waits until node 2's status read and full read show the same
	// for both viewers, and returns how the last status read was answered.
	agree := func(phase string) (byReplica bool) {
		t.Helper()
		diff := ""
		testwait.Forf(t, func() string {
			return fmt.Sprintf("%s: node 2's status read to agree with its full read: %s", phase, diff)
		}, func() bool {
			diff = ""
			s0 := served()
			for _, viewer := range []string{"", "v"} {
				if d := compareReads(t, n2, truth, viewer, ids); d != "" {
					diff = d
				}
			}
			byReplica = served() > s0
			return diff == ""
		})
		return byReplica
	}

	change(n1, 60)
	change(n2, 60)
	if !agree("after changes on both nodes") {
		// The last comparison may have come before the replica's fill; it
		// must answer within moments.
		testwait.For(t, "node 2's replica to answer a status read", func() bool { return agree("replica ready") })
	}
	if st := statusRead(t, n2, "v", ids)["v"]; st == nil || *st != "invisible" {
		t.Errorf("v reads itself %s, want invisible", show(st))
	}
	// Expiry: every HTTP device ends a ttl after its last beat, announced
	// by a sweep on either node; the sockets keep r0…r3 present.
	testwait.For(t, "every HTTP device to expire (Redis reads 4 users present at most)", func() bool {
		code, raw := truth.do("POST", "/v1/presence/batch", apiKey, map[string]any{"user_ids": ids})
		var full map[string]struct {
			Status *string `json:"status"`
		}
		if code != 200 || json.Unmarshal(raw, &full) != nil {
			t.Fatalf("POST /v1/presence/batch: %d %s", code, raw)
		}
		present := 0
		for _, u := range full {
			if u.Status != nil && *u.Status != "offline" {
				present++
			}
		}
		return present <= 4
	})
	if !agree("after expiry") {
		t.Error("the replica did not answer after expiry")
	}
	online := 0
	for _, st := range statusRead(t, n2, "", ids) {
		if st != nil && *st != "offline" {
			online++
		}
	}
	if online == 0 || online > 4 {
		t.Errorf("after expiry %d users read present, want 1…4 (the sockets of r0…r3, some hidden)", online)
	}

	// NATS stops: node 2 cannot hear node 1's changes, so its replica must
	// not answer; its reads go to Redis and stay right.
	if err := b.nats.Stop(); err != nil {
		t.Fatal(err)
	}
	r0 := refused()
	change(n1, 40)
	if agree("NATS down") {
		t.Error("the replica answered while NATS was down")
	}
	if refused() <= r0 {
		t.Error("no status read went to the store while NATS was down")
	}
	if err := b.nats.Start(); err != nil {
		t.Fatal(err)
	}
	change(n1, 20)
	testwait.For(t, "node 2's replica to answer again after NATS came back", func() bool { return agree("NATS back") })
	if fills := metric(t, n2.server, "presenced_replica_fills_total"); fills < 2 {
		t.Errorf("node 2's replica was filled %v times, want a fill at start and one after NATS came back", fills)
	}
	if len(flags) > 0 && flags[0] == "-read-replica-users" {
		if ev := metric(t, n2.server, "presenced_replica_evicted_total"); ev == 0 {
			t.Error("node 2's replica of 16 users read 41 ids and evicted none")
		}
	}
	full := func() float64 { return metric(t, n2.server, `presenced_replica_full_reads_total{source="replica"}`) }
	if full() == 0 {
		t.Error("node 2's replica answered no full view")
	}
	// The read of one user is a full view too.
	f0 := full()
	if code, raw := n2.do("GET", "/v1/presence/"+ids[5], apiKey, nil); code != 200 {
		t.Errorf("GET /v1/presence/%s: %d %s", ids[5], code, raw)
	}
	if full() <= f0 {
		t.Error("GET /v1/presence/{id} was not answered by node 2's replica")
	}
	if n := metric(t, n2.server, "presenced_replica_device_notes_total"); n == 0 {
		t.Error("node 2 heard no device note (second devices came and went)")
	}
	for _, c := range socks {
		_ = c.Close()
	}
}

// fullView is a view as POST /v1/presence/batch answers it.
type fullView struct {
	Status   *string `json:"status"`
	LastSeen *string `json:"last_seen"`
	Text     *string `json:"status_text"`
	Devices  *int    `json:"devices"`
	Version  *uint64 `json:"version"`
}

// fullRead is n's POST /v1/presence/batch of ids for viewer.
func fullRead(t *testing.T, n *proc, viewer string, ids []string) map[string]fullView {
	t.Helper()
	body := map[string]any{"user_ids": ids}
	if viewer != "" {
		body["viewer_id"] = viewer
	}
	code, raw := n.do("POST", "/v1/presence/batch", apiKey, body)
	if code != 200 {
		t.Fatalf("POST /v1/presence/batch: %d %s", code, raw)
	}
	var full map[string]fullView
	if err := json.Unmarshal(raw, &full); err != nil {
		t.Fatal(err)
	}
	return full
}

// compareReads returns how n's status read and full read of ids for
// viewer differ from truth's full read ("" if they do not): every field
// but a present user's last_seen, which n's replica reads as now.
func compareReads(t *testing.T, n, truth *proc, viewer string, ids []string) string {
	t.Helper()
	got := statusRead(t, n, viewer, ids)
	gotFull := fullRead(t, n, viewer, ids)
	full := fullRead(t, truth, viewer, ids)
	var diffs []string
	for _, id := range ids {
		g, w := got[id], full[id].Status
		if (g == nil) != (w == nil) || (g != nil && *g != *w) {
			diffs = append(diffs, fmt.Sprintf("%s: %s, full read %s", id, show(g), show(w)))
		}
		gf, wf := gotFull[id], full[id]
		present := id == viewer || (wf.Status != nil && *wf.Status != "offline")
		if !sameP(gf.Status, wf.Status) || !sameP(gf.Text, wf.Text) || !sameP(gf.Devices, wf.Devices) ||
			!sameP(gf.Version, wf.Version) || (!present && !sameP(gf.LastSeen, wf.LastSeen)) ||
			(gf.LastSeen == nil) != (wf.LastSeen == nil) {
			diffs = append(diffs, fmt.Sprintf("%s: full view %s, in Redis %s", id, fullString(gf), fullString(wf)))
		}
	}
	if len(diffs) == 0 {
		return ""
	}
	return fmt.Sprintf("viewer %q: %s", viewer, strings.Join(diffs, "; "))
}

// statusRead is n's GET /presence/batch of ids for viewer.
func statusRead(t *testing.T, n *proc, viewer string, ids []string) map[string]*string {
	t.Helper()
	q := url.Values{"user_ids": {strings.Join(ids, ",")}}
	if viewer != "" {
		q.Set("viewer_id", viewer)
	}
	code, raw := n.do("GET", "/presence/batch?"+q.Encode(), apiKey, nil)
	if code != 200 {
		t.Fatalf("GET /presence/batch: %d %s", code, raw)
	}
	var got map[string]*string
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	return got
}

// sameP reports whether a and b are both nil or point to equal values.
func sameP[T comparable](a, b *T) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func fullString(v fullView) string {
	s := func(p any) string {
		b, _ := json.Marshal(p)
		return string(b)
	}
	return fmt.Sprintf("{status %s text %s devices %s version %s last_seen %s}", s(v.Status), s(v.Text), s(v.Devices), s(v.Version), s(v.LastSeen))
}

func show(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}

// Node 1's connection to NATS stalls (its socket stays open: it does not
// notice for minutes) while it changes users in Redis. Node 2 cannot hear
// those changes: once node 1's beacon has been silent for the bound, node
// 2's replica must stop answering — its status reads go to Redis and
// show the changes — and once node 1 is heard again it is filled again
// and answers, right.
func TestReadReplicaStopsWhenANodeIsNotHeard(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	proxy := testsvc.NewProxy(t, b.nats.Addr)
	var n1, n2 *proc
	var wg sync.WaitGroup
	wg.Go(func() {
		n1 = b.node(t, 1, "-read-replica", "-heartbeat-ttl", "30s", "-nats-url", "nats://"+proxy.Addr)
	})
	wg.Go(func() { n2 = b.node(t, 2, "-read-replica", "-heartbeat-ttl", "30s") })
	var truth *proc // reads Redis
	wg.Go(func() { truth = b.node(t, 3, "-read-replica-users", "-1", "-heartbeat-ttl", "30s") })
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	ids := []string{"s0", "s1", "s2", "s3", "s4", "s5"}
	for _, id := range ids {
		n1.heartbeat(apiKey, id, "http")
	}
	served := func() float64 { return metric(t, n2.server, `presenced_replica_reads_total{source="replica"}`) }
	readBy := func(phase string, replica bool) {
		t.Helper()
		var by bool
		var d string
		testwait.Forf(t, func() string {
			return fmt.Sprintf("%s: reads agreeing, answered by the replica %v; last: by the replica %v, %s", phase, replica, by, d)
		}, func() bool {
			s0 := served()
			d = compareReads(t, n2, truth, "", ids)
			by = served() > s0
			return d == "" && by == replica
		})
	}
	readBy("before", true)

	proxy.Stall() // at once: what node 1 publishes from now on is held
	for _, id := range ids {
		n1.call("POST", "/v1/status", apiKey, map[string]any{"user_id": id, "status": "busy"})
	}
	// Once node 1's beacon has been silent for the bound (3 beacons), the
	// replica refuses: the reads go to Redis and show the statuses.
	readBy("node 1 not heard", false)
	for i := 0; i < 10; i++ {
		if d := compareReads(t, n2, truth, "", ids); d != "" {
			t.Fatalf("node 1 still not heard: node 2 read %s", d)
		}
		testwait.NothingWithin(100*time.Millisecond, "a read that differs, while node 1 is not heard")
	}
	if got := statusRead(t, n2, "", ids)["s0"]; got == nil || *got != "busy" {
		t.Fatalf("s0 reads %s on node 2, want busy (from Redis)", show(got))
	}
	fills := metric(t, n2.server, "presenced_replica_fills_total")
	proxy.Restore()
	readBy("node 1 heard again", true)
	if f := metric(t, n2.server, "presenced_replica_fills_total"); f <= fills {
		t.Errorf("fills %v → %v: node 2's replica was not filled again after node 1 was heard again", fills, f)
	}
}

package peers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presenced/presenced/internal/jsstream"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tracker"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// node is a fake tracker: a lease and the signs it holds per user.
type node struct {
	lease uint64
	signs map[string][]tracker.DeviceSign
	snaps map[string]presence.Snapshot // what its store answers
	asked chan []string                // the ids of each question, if not nil
}

func (n *node) LeaseID() uint64 { return n.lease }

func (n *node) StoreSnapshots(_ context.Context, now int64, ids []string, out []presence.Snapshot) []presence.Snapshot {
	for _, id := range ids {
		if s, ok := n.snaps[id]; ok {
			out = append(out, s)
		}
	}
	return out
}

// askSigns is Ask's signs.
func askSigns(p *Peers, ids []string) ([]tracker.DeviceSign, error) {
	ans, err := p.Ask(context.Background(), ids, false)
	return ans.Signs, err
}

func (n *node) Signs(now int64, ids []string, out []tracker.DeviceSign) []tracker.DeviceSign {
	if n.asked != nil {
		n.asked <- slices.Clone(ids)
	}
	for _, id := range ids {
		out = append(out, n.signs[id]...)
	}
	return out
}

func conn(t *testing.T, url string) *jsstream.Conn {
	t.Helper()
	c, err := jsstream.Dial(url, "peers-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// serve starts Peers answering from src on its own connection.
func serve(t *testing.T, url, subject string, live func() []uint64, src Source) *Peers {
	t.Helper()
	p, err := New(Config{Conn: conn(t, url), Live: live, Subject: subject, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Serve(ctx, src) }()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

// serving waits until p's Serve has subscribed and the server knows it:
// a question published after serving returns reaches p.
func serving(t *testing.T, p *Peers) {
	t.Helper()
	testwait.For(t, "Serve to subscribe", func() bool { return p.src.Load() != nil })
	if err := p.cfg.Conn.NC.Flush(); err != nil {
		t.Fatal(err)
	}
}

func sorted(s []tracker.DeviceSign) []tracker.DeviceSign {
	slices.SortFunc(s, func(a, b tracker.DeviceSign) int {
		return strings.Compare(a.User+"/"+a.Device+fmt.Sprint(a.At), b.User+"/"+b.Device+fmt.Sprint(b.At))
	})
	return s
}

// Three nodes: a question gets every other node's signs about the users
// asked (not about others, not the asker's own), in one wait; a question
// of more than ChunkIDs ids is answered in full.
func TestAskGathersEveryNode(t *testing.T) {
	srv := testsvc.NATS(t)
	live := func() []uint64 { return []uint64{1, 2, 3} }
	a := &node{lease: 1, signs: map[string][]tracker.DeviceSign{"u1": {{User: "u1", Device: "self", At: 1}}}}
	b := &node{lease: 2, signs: map[string][]tracker.DeviceSign{
		"u1": {{User: "u1", Device: "phone", At: 100, Active: true}, {User: "u1", Device: "phone", At: 150}},
		"v9": {{User: "v9", Device: "x", At: 5}}, // not asked
	}}
	c := &node{lease: 3, signs: map[string][]tracker.DeviceSign{
		"u2":   {{User: "u2", Device: "web", At: 200, Bye: true}},
		"u250": {{User: "u250", Device: "tab", At: 7, Active: true}},
	}}
	pa := serve(t, srv.URL, "t.peers", live, a)
	serve(t, srv.URL, "t.peers", live, b)
	serve(t, srv.URL, "t.peers", live, c)
	ids := []string{"u1", "u2"}
	for i := 3; i <= 250; i++ {
		ids = append(ids, fmt.Sprint("u", i))
	}
	var got []tracker.DeviceSign
	testwait.For(t, "every node serving", func() bool {
		var err error
		got, err = askSigns(pa, ids)
		if err != nil {
			t.Fatal(err)
		}
		return len(got) == 4
	})
	want := []tracker.DeviceSign{
		{User: "u1", Device: "phone", At: 100, Active: true},
		{User: "u1", Device: "phone", At: 150},
		{User: "u2", Device: "web", At: 200, Bye: true},
		{User: "u250", Device: "tab", At: 7, Active: true},
	}
	if !slices.Equal(sorted(got), sorted(want)) {
		t.Errorf("Ask = %+v, want %+v", got, want)
	}
	// Once everyone serves, a question ends when all answered.
	before := pa.Stats()
	start := time.Now()
	got, _ = askSigns(pa, ids)
	if st := pa.Stats(); len(got) != 4 || st.Asked != before.Asked+3 || st.Timeouts != before.Timeouts || st.Bad != 0 {
		t.Errorf("again: %d signs, stats %+v (before %+v) after %v: want 4 signs, 3 chunks asked, no timeout, nothing bad",
			len(got), st, before, time.Since(start))
	}
}

// A node known alive that does not answer costs the question Timeout, and
// the answers of the others are kept; with no other node alive nothing is
// sent at all.
func TestAskWaitsForTheSilentOnlyUntilTimeout(t *testing.T) {
	srv := testsvc.NATS(t)
	leases := []uint64{1, 2, 99} // 99 never answers
	live := func() []uint64 { return leases }
	a := &node{lease: 1}
	b := &node{lease: 2, signs: map[string][]tracker.DeviceSign{"u": {{User: "u", Device: "d", At: 3}}}}
	p, err := New(Config{Conn: conn(t, srv.URL), Live: live, Subject: "t.silent", Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = p.Serve(ctx, a) }()
	serve(t, srv.URL, "t.silent", live, b)
	var got []tracker.DeviceSign
	testwait.For(t, "b answers", func() bool {
		got, _ = askSigns(p, []string{"u"})
		return len(got) == 1
	})
	start := time.Now()
	got, _ = askSigns(p, []string{"u"})
	if took := time.Since(start); took < 250*time.Millisecond || len(got) != 1 {
		t.Errorf("with a silent node: %+v after %v; want b's sign after about the 300ms timeout", got, took)
	}
	if p.Stats().Timeouts == 0 {
		t.Error("no timeout counted")
	}
	leases = []uint64{1}
	before := p.Stats().Asked
	if got, err := askSigns(p, []string{"u"}); err != nil || got != nil || p.Stats().Asked != before {
		t.Errorf("alone: %+v, %v, asked %d more; want nothing asked", got, err, p.Stats().Asked-before)
	}
}

// What a node sends cannot make another add users nobody asked about,
// crash it, or hold its wait: malformed questions are not answered,
// malformed answers are dropped.
func TestMalformedMessages(t *testing.T) {
	srv := testsvc.NATS(t)
	asked := make(chan []string, 10)
	b := &node{lease: 2, asked: asked, signs: map[string][]tracker.DeviceSign{"u": {{User: "u", Device: "d", At: 3}}}}
	pb := serve(t, srv.URL, "t.bad", func() []uint64 { return nil }, b)
	nc := conn(t, srv.URL).NC
	serving(t, pb)
	for _, q := range [][]byte{
		nil, {9}, {version}, {version, 1, 200}, // too many ids
		append(encodeQuestion(nil, 1, []string{"u"}, false), 0), // trailing byte
		{version, 1, 1, 100, 'u'},                               // length past the end
		encodeQuestion(nil, 1, []string{strings.Repeat("x", presence.MaxIDLen+1)}, false),
	} {
		if _, err := nc.Request("t.bad", q, 200*time.Millisecond); err == nil {
			t.Errorf("question %x answered", q)
		}
	}
	// b counts each as it drops it, which may be after its request
	// timed out.
	testwait.For(t, "the malformed questions counted", func() bool { return pb.Stats().Bad >= 7 })
	if st := pb.Stats(); st.Bad != 7 || st.Answered != 0 || len(asked) != 0 {
		t.Errorf("after 7 malformed questions: %+v, %d reached the tracker", st, len(asked))
	}

	uSnap := presence.Snapshot{UserID: "u", Known: true, Status: presence.Invisible, Manual: presence.ManualInvisible,
		Text: "ünïcode", LastSeen: 9, PubLastSeen: 7, Devices: 2, Version: 1 << 40,
		Settings: presence.Settings{Status: presence.Contacts, LastSeen: presence.Nobody}}
	ans := encodeAnswer(nil, 5, []string{"u", "other"}, []tracker.DeviceSign{
		{User: "u", Device: "d", At: -4, Active: true}, {User: "other", Device: "e", At: 1, Bye: true}},
		[]presence.Snapshot{uSnap, {UserID: "other", Known: true, Status: presence.Online}})
	var out tracker.Answers
	if l, err := decodeAnswer(ans, map[string]bool{"u": true}, &out); err != nil || l != 5 ||
		!slices.Equal(out.Signs, []tracker.DeviceSign{{User: "u", Device: "d", At: -4, Active: true}}) ||
		!slices.Equal(out.Snapshots, []presence.Snapshot{uSnap}) {
		t.Errorf("decodeAnswer = %d, %+v, %v; want lease 5 and only u's sign and snapshot", l, out, err)
	}
	for cut := range len(ans) - 1 {
		out = tracker.Answers{}
		if _, err := decodeAnswer(ans[:cut], map[string]bool{"u": true}, &out); err == nil || len(out.Signs)+len(out.Snapshots) != 0 {
			t.Errorf("an answer cut at %d bytes was taken: %+v", cut, out)
		}
	}
}

// TestAnswerCarriesTheFrozenFace: a store snapshot of an invisible user
// whose text changed since they vanished crosses to the asker with its
// public text and version, so the asker's degraded read shows others
// the text of then; one whose face is its own crosses without.
func TestAnswerCarriesTheFrozenFace(t *testing.T) {
	snaps := []presence.Snapshot{
		{UserID: "a", Known: true, Status: presence.Invisible, Manual: presence.ManualInvisible, Text: "gone fishing",
			LastSeen: 9, PubLastSeen: 5, Devices: 1, Version: 12, PubText: "lunch", PubVersion: 10},
		{UserID: "b", Known: true, Status: presence.Busy, Manual: presence.ManualBusy, Text: "x", Version: 3, PubText: "x", PubVersion: 3},
	}
	var out tracker.Answers
	if _, err := decodeAnswer(encodeAnswer(nil, 7, []string{"a", "b"}, nil, snaps), map[string]bool{"a": true, "b": true}, &out); err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(snaps)
	want[1].PubText, want[1].PubVersion = "", 0 // its own: Public says so
	if !slices.Equal(out.Snapshots, want) {
		t.Errorf("decoded %+v, want %+v", out.Snapshots, want)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(encodeQuestion(nil, 3, []string{"a", "b"}, true))
	f.Add(encodeAnswer(nil, 3, []string{"a"}, nil, []presence.Snapshot{{UserID: "a", Known: true, Status: presence.Invisible,
		Manual: presence.ManualInvisible, Text: "y", Version: 9, PubText: "x", PubVersion: 7}}))
	f.Add(encodeAnswer(nil, 3, []string{"a"}, []tracker.DeviceSign{{User: "a", Device: "d", At: 9, Active: true}},
		[]presence.Snapshot{{UserID: "a", Known: true, Status: presence.Busy, Text: "x", Version: 3}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, ids, _, err := decodeQuestion(b); err == nil && len(ids) > ChunkIDs {
			t.Fatalf("%d ids decoded", len(ids))
		}
		var out tracker.Answers
		if _, err := decodeAnswer(b, map[string]bool{"a": true, "b": true}, &out); err == nil {
			for _, s := range out.Signs {
				if s.User != "a" && s.User != "b" {
					t.Fatalf("a sign about %q, not asked", s.User)
				}
			}
			for _, s := range out.Snapshots {
				if s.UserID != "a" && s.UserID != "b" {
					t.Fatalf("a snapshot of %q, not asked", s.UserID)
				}
			}
		}
	})
}

// A degraded read's question of 1,000 users to two other nodes, each
// holding one device of every user (a socket), over a real NATS server.
func BenchmarkAsk1000(b *testing.B) {
	srv := testsvc.NATS(b)
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprint("user-", i)
	}
	live := func() []uint64 { return []uint64{1, 2, 3} }
	nodes := make([]*node, 3)
	ps := make([]*Peers, 3)
	for i := range nodes {
		nodes[i] = &node{lease: uint64(i + 1), signs: map[string][]tracker.DeviceSign{}}
		if i > 0 {
			for j, id := range ids {
				if j%2 == i-1 {
					nodes[i].signs[id] = []tracker.DeviceSign{{User: id, Device: "phone", At: 1_700_000_000_000, Active: true}}
				}
			}
		}
		c, err := jsstream.Dial(srv.URL, "peers-bench", nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		if ps[i], err = New(Config{Conn: c, Live: live, Timeout: 2 * time.Second}); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		b.Cleanup(cancel)
		go func() { _ = ps[i].Serve(ctx, nodes[i]) }()
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, _ := askSigns(ps[0], ids)
		if len(got) == len(ids) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d signs, want %d", len(got), len(ids))
		}
	}
	before := ps[0].Stats().Timeouts
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if got, err := askSigns(ps[0], ids); err != nil || len(got) != len(ids) {
			b.Fatalf("%d signs, %v", len(got), err)
		}
	}
	if ps[0].Stats().Timeouts != before {
		b.Fatal("a question timed out")
	}
}

// One user whose signs alone would make an answer larger than NATS takes
// (a user cycling through device ids over HTTP during an outage) costs the
// asker only that user's signs: the other users of the chunk are answered,
// and the question does not wait for Timeout.
func TestAnswerTooLargeDropsOnlyTheLargestUsers(t *testing.T) {
	srv := testsvc.NATS(t)
	live := func() []uint64 { return []uint64{1, 2} }
	var big []tracker.DeviceSign
	for i := range 20000 { // ~1.5 MB of signs
		big = append(big, tracker.DeviceSign{User: "big", Device: fmt.Sprintf("%064d", i), At: 1_700_000_000_000 + int64(i)})
	}
	b := &node{lease: 2, signs: map[string][]tracker.DeviceSign{
		"big": big,
		"u":   {{User: "u", Device: "phone", At: 1_700_000_000_000, Active: true}},
	}}
	pa := serve(t, srv.URL, "t.large", live, &node{lease: 1})
	serve(t, srv.URL, "t.large", live, b)
	var got []tracker.DeviceSign
	testwait.For(t, "b answers", func() bool {
		got, _ = askSigns(pa, []string{"u", "big"})
		return len(got) > 0
	})
	before := pa.Stats().Timeouts
	start := time.Now()
	got, _ = askSigns(pa, []string{"u", "big"})
	if want := b.signs["u"]; !slices.Equal(got, want) || pa.Stats().Timeouts != before {
		t.Errorf("Ask = %d signs (%v) after %v; want u's sign only, no timeout", len(got), got[:min(len(got), 2)], time.Since(start))
	}
}

// slow is a node that takes d per question.
type slow struct {
	node
	d time.Duration
}

func (s *slow) Signs(now int64, ids []string, out []tracker.DeviceSign) []tracker.DeviceSign {
	time.Sleep(s.d) // the scenario: the time an answer takes
	return s.node.Signs(now, ids, out)
}

// A node that fell behind (more questions than it can answer, each read
// of a long outage asking) does not answer questions nobody waits for any
// more: a question asked once it caught up is answered, not queued behind
// seconds of stale ones.
func TestServeSkipsQuestionsTooLate(t *testing.T) {
	srv := testsvc.NATS(t)
	live := func() []uint64 { return []uint64{1, 2} }
	b := &slow{node: node{lease: 2, signs: map[string][]tracker.DeviceSign{"u": {{User: "u", Device: "d", At: 3}}}}, d: 5 * time.Millisecond}
	pb, err := New(Config{Conn: conn(t, srv.URL), Live: live, Subject: "t.late", Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = pb.Serve(ctx, b) }()
	pa, err := New(Config{Conn: conn(t, srv.URL), Live: live, Subject: "t.late", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "b answers", func() bool {
		got, _ := askSigns(pa, []string{"u"})
		return len(got) == 1
	})
	// 600 questions of askers gone: 3 s of b's time.
	flood := conn(t, srv.URL).NC
	q := encodeQuestion(nil, 7, []string{"u"}, false)
	for range 600 {
		if err := flood.PublishRequest("t.late", "t.gone", q); err != nil {
			t.Fatal(err)
		}
	}
	// Once Flush returns the server has routed the flood to b: the
	// question below, published after, reaches b behind it.
	if err := flood.Flush(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got, _ := askSigns(pa, []string{"u"})
	if len(got) != 1 {
		t.Errorf("a question behind a stale backlog: %d signs after %v, want b's sign within a second", len(got), time.Since(start))
	}
	if st := pb.Stats(); st.Late == 0 || st.Answered+st.Late < 600 {
		t.Errorf("b's stats %+v: want the stale questions counted late", st)
	}
}

// Answers beyond what the asker expects (nodes it has not heard yet, a
// node without a lease) are no slow consumer on the asker's connection:
// natsbus takes any as lost changes and resyncs every watcher of the node.
func TestAskIsNoSlowConsumer(t *testing.T) {
	srv := testsvc.NATS(t)
	live := func() []uint64 { return []uint64{1, 2} } // 3..32 not heard yet
	c := conn(t, srv.URL)
	slowErrs := make(chan error, 100)
	c.OnAsyncError(func(_ *nats.Subscription, err error) { slowErrs <- err })
	pa, err := New(Config{Conn: c, Live: live, Subject: "t.many", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = pa.Serve(ctx, &node{lease: 1}) }()
	ids := make([]string, 1000)
	signs := map[string][]tracker.DeviceSign{}
	for i := range ids {
		ids[i] = fmt.Sprint("u", i)
		signs[ids[i]] = []tracker.DeviceSign{{User: ids[i], Device: "d", At: 5}}
	}
	serving(t, pa)
	serving(t, serve(t, srv.URL, "t.many", live, &slow{node: node{lease: 2}, d: 100 * time.Millisecond}))
	for l := range 30 {
		serving(t, serve(t, srv.URL, "t.many", live, &node{lease: uint64(3 + l), signs: signs}))
	}
	for range 3 {
		if _, err := askSigns(pa, ids); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-slowErrs:
		t.Errorf("asking: %v", err)
	default:
	}
}

// A read that names a user many times (user_ids=u,u,u,…) asks about them
// once: one question, their signs once.
func TestAskOncePerUser(t *testing.T) {
	srv := testsvc.NATS(t)
	live := func() []uint64 { return []uint64{1, 2} }
	pa := serve(t, srv.URL, "t.dup", live, &node{lease: 1})
	serve(t, srv.URL, "t.dup", live, &node{lease: 2, signs: map[string][]tracker.DeviceSign{"u": {{User: "u", Device: "d", At: 3}}}})
	testwait.For(t, "b answers", func() bool {
		got, _ := askSigns(pa, []string{"u"})
		return len(got) == 1
	})
	ids := slices.Repeat([]string{"u"}, 250)
	before := pa.Stats().Asked
	got, err := askSigns(pa, ids)
	if err != nil || len(got) != 1 || pa.Stats().Asked != before+1 {
		t.Errorf("250 × u: %d signs, %d questions, %v; want 1 sign, 1 question", len(got), pa.Stats().Asked-before, err)
	}
}

// Cut off from NATS, Ask fails (the tracker counts the read in
// presenced_peer_ask_errors_total) — also once the beacon, hearing
// nobody, knows no node alive any more.
func TestAskFailsWithoutNATS(t *testing.T) {
	srv := testsvc.NATS(t)
	var live []uint64
	p, err := New(Config{Conn: conn(t, srv.URL), Live: func() []uint64 { return live }, Subject: "t.down"})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "disconnected", func() bool { return !p.cfg.Conn.NC.IsConnected() })
	for _, l := range [][]uint64{{1, 2}, nil} {
		live = l
		if got, err := askSigns(p, []string{"u"}); err == nil {
			t.Errorf("disconnected, live %v: Ask = %v, nil; want an error", l, got)
		}
	}
}

// A node without a lease yet (started while Redis is down) does not
// answer its own questions: it knows what it holds.
func TestNoLeaseNodeDoesNotAnswerItself(t *testing.T) {
	srv := testsvc.NATS(t)
	live := func() []uint64 { return []uint64{2} }
	self := make(chan []string, 10)
	pa := serve(t, srv.URL, "t.nolease", live, &node{lease: 0, asked: self,
		signs: map[string][]tracker.DeviceSign{"u": {{User: "u", Device: "mine", At: 1}}}})
	serve(t, srv.URL, "t.nolease", live, &node{lease: 2, signs: map[string][]tracker.DeviceSign{"u": {{User: "u", Device: "d", At: 3}}}})
	var got []tracker.DeviceSign
	testwait.For(t, "b answers", func() bool {
		got, _ = askSigns(pa, []string{"u"})
		return len(got) > 0
	})
	// The questions pa asked reached its own subscription before b
	// answered them; a malformed question sent now comes after them, so
	// once pa counted it, pa has handled its own.
	if err := conn(t, srv.URL).NC.Publish("t.nolease", []byte{9}); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "pa to handle the questions before a marker", func() bool { return pa.Stats().Bad == 1 })
	if len(self) != 0 || slices.ContainsFunc(got, func(s tracker.DeviceSign) bool { return s.Device == "mine" }) {
		t.Errorf("the node answered %d of its own questions (signs %+v)", len(self), got)
	}
}

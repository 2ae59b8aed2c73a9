package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/jackc/pgx/v5"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/wsframe"
)

// watcher is a WebSocket client that records every snapshot entry and
// presence message it reads, in order, from a goroutine of its own.
type watcher struct {
	name string
	nc   net.Conn

	mu   sync.Mutex
	got  []seen
	err  error
	done chan struct{}
}

// seen is one state of a user as a watcher read it.
type seen struct {
	user     string
	version  uint64 // 0: null
	content  string // the message without its type and version
	snapshot bool
}

func newWatcher(t *testing.T, addr, user string) *watcher {
	t.Helper()
	tok, err := auth.Sign(testSecret, user, "", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nc, br, _, err := ws.Dialer{Timeout: 5 * time.Second}.Dial(context.Background(), "ws://"+addr+"/v1/ws?token="+tok)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	w := &watcher{name: user + "@" + addr, nc: nc, done: make(chan struct{})}
	r := bufio.NewReader(nc)
	if br != nil {
		r = br
	}
	go w.read(r)
	t.Cleanup(func() { nc.Close(); <-w.done })
	return w
}

func (w *watcher) read(r *bufio.Reader) {
	defer close(w.done)
	for {
		f, err := wsframe.Read(r)
		if err == nil && f.Header.OpCode != ws.OpText {
			err = fmt.Errorf("opcode %d", f.Header.OpCode)
		}
		var m map[string]json.RawMessage
		if err == nil {
			err = json.Unmarshal(f.Payload, &m)
		}
		if err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			return
		}
		var typ string
		_ = json.Unmarshal(m["type"], &typ)
		w.mu.Lock()
		switch typ {
		case "snapshot":
			var users map[string]map[string]json.RawMessage
			_ = json.Unmarshal(m["users"], &users)
			for u, s := range users {
				s["user_id"], _ = json.Marshal(u)
				w.got = append(w.got, state(s, true))
			}
		case "presence":
			w.got = append(w.got, state(m, false))
		}
		w.mu.Unlock()
	}
}

func state(m map[string]json.RawMessage, snapshot bool) seen {
	var s seen
	_ = json.Unmarshal(m["user_id"], &s.user)
	_ = json.Unmarshal(m["version"], &s.version)
	s.content = fmt.Sprintf("%s %s %s", m["status"], m["status_text"], m["last_seen"])
	s.snapshot = snapshot
	return s
}

func (w *watcher) send(t *testing.T, msg string) {
	t.Helper()
	if err := ws.WriteFrame(w.nc, ws.MaskFrameInPlace(ws.NewTextFrame([]byte(msg)))); err != nil {
		t.Fatal(err)
	}
}

// since returns what w read from index i on.
func (w *watcher) since(i int) []seen {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]seen(nil), w.got[i:]...)
}

func (w *watcher) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		panic(fmt.Sprintf("%s: %v", w.name, w.err))
	}
	return len(w.got)
}

// wait waits until w read a state of user whose content holds want, after
// index i, and returns the index after it.
func (w *watcher) wait(t *testing.T, i int, user, want string) int {
	t.Helper()
	n := i
	testwait.For(t, fmt.Sprintf("%s to read %s %s", w.name, user, want), func() bool {
		for j, s := range w.since(i) {
			if s.user == user && strings.Contains(s.content, want) {
				n = i + j + 1
				return true
			}
		}
		return false
	})
	return n
}

// checkpointed waits until PostgreSQL holds, for each of users, a
// last_seen and at least the newest version any of watchers read: a
// checkpoint wrote them.
func checkpointed(t *testing.T, pgURL string, watchers []*watcher, users []string) {
	t.Helper()
	want := map[string]uint64{}
	for _, w := range watchers {
		for _, s := range w.since(0) {
			want[s.user] = max(want[s.user], s.version)
		}
	}
	conn, err := pgx.Connect(t.Context(), pgURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var behind []string
	testwait.Forf(t, func() string { return fmt.Sprintf("a checkpoint of every user; behind: %v", behind) }, func() bool {
		rows, err := conn.Query(t.Context(), `SELECT user_id, version FROM users WHERE user_id = ANY($1) AND last_seen > 0`, users)
		if err != nil {
			behind = []string{err.Error()}
			return false
		}
		have := map[string]uint64{}
		for rows.Next() {
			var id string
			var v int64
			if err := rows.Scan(&id, &v); err == nil {
				have[id] = uint64(v)
			}
		}
		rows.Close()
		behind = behind[:0]
		for _, u := range users {
			if v, ok := have[u]; !ok || v < want[u] {
				behind = append(behind, u)
			}
		}
		return len(behind) == 0
	})
}

// TestResyncSendsOnlyWhatChanged runs two nodes on private Redis,
// PostgreSQL and NATS, with a watcher on each watching 12 users (on both
// nodes, in every state), and puts them through a NATS restart, a Redis
// restart that loses its data and a 3 s Redis hang. After each, both
// nodes resync their watchers; each watcher must be sent exactly what
// changed meanwhile (one change made during the NATS outage) and nothing
// else — no exact duplicate, no message at a version it was sent
// already, never a version lower than one it got.
func TestResyncSendsOnlyWhatChanged(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Redis, PostgreSQL and NATS")
	}
	rs, pg, ns := testsvc.Redis(t), testsvc.Postgres(t), testsvc.NATS(t)
	cfg := func(id string) app.Config {
		return app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1, TTL: 2 * time.Minute,
			RedisURL: rs.URL, PostgresURL: pg.URL, NATSURL: ns.URL, NodeID: id}
	}
	nodes := []string{runNode(t, cfg("node-a")), runNode(t, cfg("node-b"))}
	testwait.For(t, "each node to hear the other", func() bool {
		for _, addr := range nodes {
			alive := 0
			for _, n := range getStats(t, addr).Nodes {
				if n.Health == "alive" {
					alive++
				}
			}
			if alive != 1 {
				return false
			}
		}
		return true
	})

	// Ten users on sockets, five on each node, in every state; one who
	// said bye over HTTP, one never seen.
	states := []string{
		`{"type":"set_status","status":"online"}`,
		`{"type":"set_status","status":"busy","text":"meeting"}`,
		`{"type":"set_status","status":"away"}`,
		`{"type":"set_status","status":"invisible","text":"hidden"}`,
		`{"type":"set_status","status":"online","text":"hi"}`,
	}
	var users []string
	targets := map[string]*watcher{}
	for i := range 10 {
		u := fmt.Sprint("t", i)
		users = append(users, u)
		targets[u] = newWatcher(t, nodes[i/5], u)
		targets[u].send(t, states[i%5])
	}
	mustCall(t, nodes[0], "POST", "/v1/heartbeat", `{"user_id":"gone","device_id":"d"}`)
	mustCall(t, nodes[0], "POST", "/v1/bye", `{"user_id":"gone","device_id":"d"}`)
	users = append(users, "gone", "never")
	subscribe := `{"type":"subscribe","user_ids":["` + strings.Join(users, `","`) + `"]}`
	watchers := []*watcher{newWatcher(t, nodes[0], "wa"), newWatcher(t, nodes[1], "wb")}
	for _, w := range watchers {
		w.send(t, subscribe)
		testwait.For(t, w.name+"'s snapshot", func() bool { return w.count() >= len(users) })
	}
	// Every state set above reached both watchers.
	for _, w := range watchers {
		for i, u := range users[:10] {
			want := []string{`"online" null`, `"busy" "meeting"`, `"away" null`, `"offline" "hidden"`, `"online" "hi"`}[i%5]
			testwait.For(t, w.name+" to read "+u+" "+want, func() bool {
				for _, s := range w.since(0) {
					if s.user == u && strings.HasPrefix(s.content, want) {
						return true
					}
				}
				return false
			})
		}
	}
	checkpointed(t, pg.URL, watchers, users[:len(users)-1]) // all but "never"

	resynced := func(addr string) float64 { return getStats(t, addr).Metrics["presenced_fanout_resynced_total"] }
	mark := 0
	// fault runs one fault with both watchers' marks set before it, waits
	// for both nodes to resync, then sends a marker change of t0 that both
	// watchers must read (everything sent before it has arrived) and
	// returns what each watcher read meanwhile, the marker left out.
	fault := func(name string, do func()) [][]seen {
		t.Helper()
		var from []int
		var before []float64
		for i, w := range watchers {
			from = append(from, w.count())
			before = append(before, resynced(nodes[i]))
		}
		do()
		for i, addr := range nodes {
			testwait.For(t, name+": node "+addr+" to resync its watchers", func() bool { return resynced(addr) > before[i] })
		}
		mark++
		text := fmt.Sprint("mark", mark)
		targets["t0"].send(t, `{"type":"set_status","status":"online","text":"`+text+`"}`)
		var out [][]seen
		for i, w := range watchers {
			end := w.wait(t, from[i], "t0", text)
			got := w.since(from[i])[:end-from[i]-1]
			t.Logf("%s: %s read %d messages besides the marker: %+v", name, w.name, len(got), got)
			out = append(out, got)
		}
		return out
	}

	// NATS restarts; meanwhile t5 (on node b) turns busy: node a's
	// watcher misses it on the bus and must be sent it once, node b's
	// watcher was sent it live.
	got := fault("NATS restart", func() {
		if err := ns.Stop(); err != nil {
			t.Fatal(err)
		}
		// Counted before the change is sent: it may reach wb at once.
		from := watchers[1].count()
		targets["t5"].send(t, `{"type":"set_status","status":"busy","text":"while NATS was down"}`)
		watchers[1].wait(t, from, "t5", "while NATS was down")
		if err := ns.Start(); err != nil {
			t.Fatal(err)
		}
	})
	for i, w := range watchers {
		if len(got[i]) != 1 || got[i][0].user != "t5" || !strings.Contains(got[i][0].content, "while NATS was down") {
			t.Errorf("NATS restart: %s read %+v, want t5's change alone", w.name, got[i])
		}
	}
	// Redis restarts empty: every node claims its devices again, users
	// are loaded at a new epoch; nothing watchers see has changed.
	got = fault("Redis restart", func() {
		if err := rs.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := rs.Start(); err != nil {
			t.Fatal(err)
		}
	})
	for i, w := range watchers {
		if len(got[i]) != 0 {
			t.Errorf("Redis restart: %s read %+v, want nothing", w.name, got[i])
		}
	}
	// Redis hangs for 3 s (calls time out after 1 s).
	got = fault("Redis hang", func() {
		if err := rs.Pause(); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, "a node to see Redis down", func() bool {
			code, body := call(t, nodes[0], "GET", "/readyz", "")
			return code == 200 && strings.Contains(body, `"redis":"unavailable"`)
		})
		time.Sleep(2 * time.Second) // the fault: Redis hangs on
		if err := rs.Resume(); err != nil {
			t.Fatal(err)
		}
	})
	for i, w := range watchers {
		if len(got[i]) != 0 {
			t.Errorf("Redis hang: %s read %+v, want nothing", w.name, got[i])
		}
	}

	// Over the whole run: each user's versions only grow, for each watcher.
	for _, w := range watchers {
		last := map[string]seen{}
		for _, s := range w.since(0) {
			if p, ok := last[s.user]; ok && s.version <= p.version {
				kind := "an older version"
				switch {
				case s.version == p.version && s.content == p.content:
					kind = "an exact duplicate"
				case s.version == p.version:
					kind = "the same version"
				}
				t.Errorf("%s: %s %+v after %+v", w.name, kind, s, p)
			}
			last[s.user] = s
		}
	}
}

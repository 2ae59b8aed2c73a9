package app_test

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/app/apptest"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/testwait"
)

// TestNoTimingSideChannel: no read path answers faster or slower because
// of what the viewer may not see. A stranger reads, through the public,
// single, batch and snapshot paths, pairs of users who look the same to
// them — an invisible user still connected and one who logged out in an
// earlier run of the node (not in memory), a contacts-only user online
// and one offline — interleaved in random order. Which of the pair
// answers first must be a coin toss: before the fix, the invisible user
// answered first in 98% of pairs (held users skipped the durable read).
// No absolute time is asserted: only the share of pairs one side won, in
// one run.
func TestNoTimingSideChannel(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: thousands of timed requests")
	}
	dir := t.TempDir()
	cfg := app.Config{DataDir: dir, APIKey: testKey, JWTSecret: testSecret, PollInterval: -1}

	// Run 1: gon1 and hof1 are seen, then leave; the node stops, so the
	// next run holds nothing of them in memory.
	addr, stop := startNode(t, cfg)
	stopped := func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	mustCall(t, addr, "PUT", "/v1/users/hof1/settings", `{"status_visibility":"contacts","last_seen_visibility":"contacts"}`)
	for _, u := range []string{"gon1", "hof1"} {
		mustCall(t, addr, "POST", "/v1/heartbeat", `{"user_id":"`+u+`","device_id":"d"}`)
		mustCall(t, addr, "POST", "/v1/bye", `{"user_id":"`+u+`","device_id":"d"}`)
	}
	stopped()

	// Run 2: inv1 connected and invisible, hon1 connected and contacts-only.
	addr, stop = startNode(t, cfg)
	defer stopped()
	mustCall(t, addr, "PUT", "/v1/users/hon1/settings", `{"status_visibility":"contacts","last_seen_visibility":"contacts"}`)
	inv := dialWS(t, addr, "inv1")
	inv.msg("welcome")
	inv.send(`{"type":"subscribe","user_ids":["inv1"]}`)
	inv.msg("snapshot")
	inv.send(`{"type":"set_status","status":"invisible"}`)
	if m := inv.msg("presence"); m["status"] != "invisible" { // what only the user is shown
		t.Fatalf("inv1's own socket got %v", m)
	}
	hon := dialWS(t, addr, "hon1")
	hon.msg("welcome")

	tok, err := auth.Sign(testSecret, "stranger", "", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	get := func(path, body string, bearer bool) func(id string) []byte {
		return func(id string) []byte {
			method, b := "GET", io.Reader(nil)
			if body != "" {
				method, b = "POST", strings.NewReader(fmt.Sprintf(body, id))
			}
			url := "http://" + addr + path
			if strings.Contains(path, "%s") {
				url = "http://" + addr + fmt.Sprintf(path, id)
			}
			req, err := http.NewRequest(method, url, b)
			if err != nil {
				t.Fatal(err)
			}
			if bearer {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			out, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, out)
			}
			return out
		}
	}
	// A socket may send 40 messages at once (then 20 a second): each
	// socket of the stranger serves 14 reads (a subscribe and an
	// unsubscribe each), then the next one takes over.
	const n = 800
	var socks []*wsClient
	reads := 0
	snapshot := func(id string) []byte {
		if reads%14 == 0 {
			if len(socks) > 0 { // its device ends at once (32 devices a user)
				socks[len(socks)-1].send(`{"type":"bye"}`)
			}
			c := dialWS(t, addr, "stranger")
			c.msg("welcome")
			socks = append(socks, c)
		}
		reads++
		c := socks[len(socks)-1]
		c.send(`{"type":"subscribe","user_ids":["` + id + `"]}`)
		_, p := c.next()
		c.send(`{"type":"unsubscribe","user_ids":["` + id + `"]}`)
		return p
	}
	paths := []struct {
		name string
		read func(id string) []byte
	}{
		{"public", get("/v1/public/%s", "", false)},
		{"single", get("/v1/presence/%s", "", true)},
		{"batch", get("/v1/presence/batch", `{"user_ids":["%s"]}`, true)},
		{"snapshot", snapshot},
	}
	pairs := [][2]string{{"inv1", "gon1"}, {"hon1", "hof1"}}
	for _, p := range paths {
		for _, pair := range pairs {
			// The two answers are the same bytes but the id and the time
			// (what the privacy filter promises; checked in depth
			// elsewhere): here, the same length.
			a, b := p.read(pair[0]), p.read(pair[1])
			if len(a) != len(b) {
				t.Fatalf("%s: %s answers %s, %s answers %s", p.name, pair[0], a, pair[1], b)
			}
			if bytes.Contains(a, []byte("invisible")) || bytes.Contains(a, []byte("online")) {
				t.Fatalf("%s: a stranger reads %s", p.name, a)
			}
			for range 50 { // warm up
				p.read(pair[0])
				p.read(pair[1])
			}
			first := 0
			for range n {
				swap := rand.IntN(2) == 1
				x, y := pair[0], pair[1]
				if swap {
					x, y = y, x
				}
				t0 := time.Now()
				p.read(x)
				t1 := time.Now()
				p.read(y)
				t2 := time.Now()
				if (t1.Sub(t0) < t2.Sub(t1)) != swap {
					first++ // pair[0] answered faster
				}
			}
			share := float64(first) / n
			t.Logf("%s, %s vs %s: %s answered faster in %.1f%% of %d pairs", p.name, pair[0], pair[1], pair[0], 100*share, n)
			if share < 0.3 || share > 0.7 {
				t.Errorf("%s: %s answered faster than %s in %.1f%% of %d interleaved pairs: a stopwatch tells them apart",
					p.name, pair[0], pair[1], 100*share, n)
			}
		}
	}
}

// startNode runs an app on 127.0.0.1 until stop is called; stop returns
// what Run returned (nil after the first call).
func startNode(t testing.TB, cfg app.Config) (addr string, stop func() error) {
	t.Helper()
	_, addr, stop = apptest.Start(t, cfg)
	testwait.For(t, "the node ready", func() bool { code, _ := call(t, addr, "GET", "/readyz", ""); return code == 200 })
	return addr, stop
}

func mustCall(t testing.TB, addr, method, path, body string) {
	t.Helper()
	if code, out := call(t, addr, method, path, body); code != 200 {
		t.Fatalf("%s %s: %d %s", method, path, code, out)
	}
}

package app_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// BenchmarkBystanderStatus measures one user's POST /v1/status on an
// embedded node (SQLite), one request at a time with the API key, alone
// (flood=0) and while 8 backend connections with the API key replace
// 10,000-entry contact lists in a loop (flood=8; each owner's list
// alternates between two disjoint lists, so every replacement rewrites
// 10,000 rows). The figures are the bystander's latency percentiles
// (p50, p99, max, in ms), the flood's replacements per second and how
// many of them the node refused (busy). Compare flood=8 with flood=0 of
// the same run: the machine is shared.
//
//	go test -run '^$' -bench BystanderStatus -benchtime 200x -count 1 ./internal/app/
func BenchmarkBystanderStatus(b *testing.B) {
	for _, flood := range []int{0, 8} {
		b.Run("flood="+strconv.Itoa(flood), func(b *testing.B) { benchBystander(b, flood) })
	}
}

func benchBystander(b *testing.B, flood int) {
	addr, stop := startNode(b, app.Config{DataDir: b.TempDir(), APIKey: "k", JWTSecret: []byte("s"), PollInterval: -1})
	defer func() {
		if err := stop(); err != nil {
			b.Errorf("Run: %v", err)
		}
	}()
	lists := [2][]byte{contactList("a", 10_000), contactList("b", 10_000)}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var done, refused atomic.Int64
	var firstErr atomic.Value
	for i := range flood {
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
		url := fmt.Sprintf("http://%s/v1/users/owner%d/contacts", addr, i)
		wg.Go(func() {
			defer hc.CloseIdleConnections()
			for n := 0; ctx.Err() == nil; n++ {
				code, body, err := do(ctx, hc, "PUT", url, lists[n%2])
				switch {
				case ctx.Err() != nil:
				case err != nil:
					firstErr.CompareAndSwap(nil, err.Error())
				case code == http.StatusOK:
					done.Add(1)
				case code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests:
					refused.Add(1)
				default:
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %s", code, body))
				}
			}
		})
	}
	defer func() {
		cancel()
		wg.Wait()
	}()
	testwait.For(b, "the flood to run", func() bool { return done.Load() >= int64(flood) })

	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer hc.CloseIdleConnections()
	bodies := [2][]byte{[]byte(`{"user_id":"bystander","status":"busy"}`), []byte(`{"user_id":"bystander","status":"online"}`)}
	lat := make([]time.Duration, 0, b.N)
	done0, refused0 := done.Load(), refused.Load()
	start := time.Now()
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		code, body, err := do(context.Background(), hc, "POST", "http://"+addr+"/v1/status", bodies[i%2])
		lat = append(lat, time.Since(t0))
		if err != nil || code != http.StatusOK {
			b.Fatalf("POST /v1/status: %d %s %v", code, body, err)
		}
	}
	b.StopTimer()
	elapsed := time.Since(start)
	if e := firstErr.Load(); e != nil {
		b.Fatalf("flood: %v", e)
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
	b.ReportMetric(ms(lat[min(len(lat)-1, len(lat)*99/100)]), "p99-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
	b.ReportMetric(float64(done.Load()-done0)/elapsed.Seconds(), "flood-writes/s")
	b.ReportMetric(float64(refused.Load()-refused0)/elapsed.Seconds(), "flood-refused/s")
}

// contactList is the body {"contacts":["<prefix>0",…]} of n contacts.
func contactList(prefix string, n int) []byte {
	b := []byte(`{"contacts":[`)
	for i := range n {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, prefix+strconv.Itoa(i))
	}
	return append(b, "]}"...)
}

// do sends one request with the API key "k" and reads the answer.
func do(ctx context.Context, hc *http.Client, method, url string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer k")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// BenchmarkWebhookConfirm measures what webhooks add to a change's
// answer: the latency (p50, p99 in ms) of POST /v1/status (busy and
// online in turn: each a change, written durably) and of a first POST
// /v1/heartbeat of a new user (a change, nothing durable), one request at
// a time, on an embedded node (SQLite: the outbox's fsync) and on a node
// with NATS (the stream's ack), without webhooks and with one endpoint
// (a local receiver that accepts everything).
//
//	go test -run '^$' -bench WebhookConfirm -benchtime 400x -count 1 ./internal/app/
func BenchmarkWebhookConfirm(b *testing.B) {
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
	defer recv.Close()
	for _, mode := range []string{"embedded", "nats"} {
		for _, hooks := range []bool{false, true} {
			name := mode + "/webhooks=off"
			if hooks {
				name = mode + "/webhooks=on"
			}
			b.Run(name, func(b *testing.B) {
				cfg := app.Config{DataDir: b.TempDir(), APIKey: "k", JWTSecret: []byte("s"), PollInterval: -1, Dev: true}
				if mode == "nats" {
					cfg.NATSURL, cfg.NoIngest = testsvc.NATS(b).URL, true
				}
				if hooks {
					cfg.WebhookURLs, cfg.WebhookSecret = []string{recv.URL}, []byte("bench-webhook-secret")
				}
				benchChanges(b, cfg)
			})
		}
	}
}

func benchChanges(b *testing.B, cfg app.Config) {
	addr, stop := startNode(b, cfg)
	defer func() {
		if err := stop(); err != nil {
			b.Errorf("Run: %v", err)
		}
	}()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer hc.CloseIdleConnections()
	run := b.Name()
	status := [2][]byte{[]byte(`{"user_id":"writer","status":"busy"}`), []byte(`{"user_id":"writer","status":"online"}`)}
	var st, hb []time.Duration
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		code, body, err := do(context.Background(), hc, "POST", "http://"+addr+"/v1/status", status[i%2])
		st = append(st, time.Since(t0))
		if err != nil || code != http.StatusOK {
			b.Fatalf("POST /v1/status: %d %s %v", code, body, err)
		}
		t0 = time.Now()
		code, body, err = do(context.Background(), hc, "POST", "http://"+addr+"/v1/heartbeat",
			fmt.Appendf(nil, `{"user_id":"%s-%d","device_id":"d"}`, run, i))
		hb = append(hb, time.Since(t0))
		if err != nil || code != http.StatusOK {
			b.Fatalf("POST /v1/heartbeat: %d %s %v", code, body, err)
		}
	}
	b.StopTimer()
	ms := func(lat []time.Duration, q int) float64 {
		slices.Sort(lat)
		return float64(lat[min(len(lat)-1, len(lat)*q/100)].Microseconds()) / 1000
	}
	b.ReportMetric(ms(st, 50), "status-p50-ms")
	b.ReportMetric(ms(st, 99), "status-p99-ms")
	b.ReportMetric(ms(hb, 50), "beat-p50-ms")
	b.ReportMetric(ms(hb, 99), "beat-p99-ms")
}

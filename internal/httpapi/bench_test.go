package httpapi_test

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/benchfix"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/httpapi"
	"github.com/presenced/presenced/internal/query"
	"github.com/presenced/presenced/internal/tracker"
)

// benchServer is the HTTP API over 1,000,000 tracked users in memory.
func benchServer(b *testing.B) (http.Handler, [][]string) {
	b.Helper()
	now := time.Now()
	clk := clock.NewFake(now)
	store := benchfix.Population(1<<20, now)
	tr, err := tracker.New(tracker.Config{Store: store, Durable: benchfix.Nop{}, Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	r, err := query.New(query.Config{States: store, Profiles: benchfix.Nop{}, Contacts: benchfix.Nop{}, Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := httpapi.New(httpapi.Config{
		Tracker: tr, Reader: r, Contacts: benchfix.Nop{}, Profiles: benchfix.Nop{},
		Auth: auth.New(auth.Config{APIKey: apiKey}), Clock: clk,
	})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	batches := make([][]string, 64)
	for i := range batches {
		batches[i] = benchfix.Sample(rng, 1<<20, 1000)
	}
	return srv, batches
}

// BenchmarkHTTPBatch1000 is a batch read of 1,000 random ids out of
// 1,000,000 through the HTTP handler, JSON decoding and encoding included.
// Goal: ≤ 1 ms. "loopback" adds a real TCP round trip through net/http.
func BenchmarkHTTPBatch1000(b *testing.B) {
	h, batches := benchServer(b)
	seed := make([]string, len(batches))
	post := make([][]byte, len(batches))
	for i, ids := range batches {
		seed[i] = "/presence/batch?user_ids=" + strings.Join(ids, ",")
		post[i] = []byte(`{"user_ids":["` + strings.Join(ids, `","`) + `"]}`)
	}
	b.Run("seed-GET/handler", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			req := httptest.NewRequest("GET", seed[i%len(seed)], nil)
			req.Header.Set("Authorization", keyHdr)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != 200 {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
			i++
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/read")
	})
	b.Run("v1-POST/handler", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			req := httptest.NewRequest("POST", "/v1/presence/batch", bytes.NewReader(post[i%len(post)]))
			req.Header.Set("Authorization", keyHdr)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != 200 {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
			i++
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/read")
	})
	ts := httptest.NewServer(h)
	defer ts.Close()
	client := ts.Client()
	b.Run("seed-GET/loopback", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			req, _ := http.NewRequest("GET", ts.URL+seed[i%len(seed)], nil)
			req.Header.Set("Authorization", keyHdr)
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("status %d", resp.StatusCode)
			}
			i++
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/read")
	})
}

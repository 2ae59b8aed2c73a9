package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/wire"
)

// gauge reads the unlabelled metric name of the node at addr.
func gauge(t *testing.T, addr, name string) int {
	t.Helper()
	_, body := call(t, addr, "GET", "/metrics", "")
	m := regexp.MustCompile(`(?m)^` + name + ` (\d+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in /metrics", name)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// ownedDevices reads presenced_owned_devices of the node at addr.
func ownedDevices(t *testing.T, addr string) int {
	return gauge(t, addr, "presenced_owned_devices")
}

// ingestPartitions reads presenced_ingest_partitions of the node at addr.
func ingestPartitions(t *testing.T, addr string) int {
	return gauge(t, addr, "presenced_ingest_partitions")
}

// Two scale-out nodes take the JetStream ingest's events, any message on
// either node: each device is owned by the node that owns its user's
// partition, never by both; when a node stops, the other owns them all;
// nobody is shown offline by it, and a device whose events stop is shown
// offline once.
func TestJetStreamIngestDevicesOwned(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Redis, PostgreSQL and NATS")
	}
	rs, pg, ns := testsvc.Redis(t), testsvc.Postgres(t), testsvc.NATS(t)
	cfg := func(id string) app.Config {
		return app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1, TTL: 3 * time.Second,
			RedisURL: rs.URL, PostgresURL: pg.URL, NATSURL: ns.URL, NodeID: id}
	}
	a := runNode(t, cfg("node-a"))
	b, stopB := startNode(t, cfg("node-b"))

	nc, err := nats.Connect(ns.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// Every change, as the nodes publish them.
	var mu sync.Mutex
	changes := map[string][]string{}
	sub, err := nc.Subscribe("presence.changes.>", func(m *nats.Msg) {
		var c struct {
			UserID string `json:"user_id"`
			Prev   string `json:"prev"`
			Status string `json:"status"`
		}
		if json.Unmarshal(m.Data, &c) == nil && c.UserID != "" {
			mu.Lock()
			changes[c.UserID] = append(changes[c.UserID], c.Prev+">"+c.Status)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	const users, quiet = 40, 8
	var silent atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { // the connection layer: every device beats every 500 ms
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		for {
			for i := range users {
				if i < quiet && silent.Load() {
					continue
				}
				v := fmt.Sprintf(`{"type":"heartbeat","user_id":"u%d","device_id":"d","at":%q}`, i, time.Now().UTC().Format(wire.TimeLayout))
				if _, err := js.Publish(ctx, fmt.Sprintf("presence.ingest.gw%d", i%3), []byte(v)); err != nil && ctx.Err() == nil {
					t.Errorf("publish: %v", err)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	defer func() { cancel(); wg.Wait() }()

	// Once the nodes see each other (their partitions add up to all 256:
	// until then one of them owns partitions the other does too) and the
	// devices that moved meanwhile were claimed again.
	testwait.For(t, "the devices owned by the two nodes, each once", func() bool {
		if ingestPartitions(t, a)+ingestPartitions(t, b) != 256 {
			return false
		}
		na, nb := ownedDevices(t, a), ownedDevices(t, b)
		return na > 0 && nb > 0 && na+nb == users
	})
	for range 10 { // and so it stays
		if na, nb := ownedDevices(t, a), ownedDevices(t, b); na+nb != users {
			t.Fatalf("a owns %d and b %d devices of %d", na, nb, users)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// b stops: a owns every device.
	if err := stopB(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, "node a owning every device", func() bool { return ownedDevices(t, a) == users })

	// Users 0–7 fall silent: each is shown offline once.
	silent.Store(true)
	testwait.For(t, "node a owning the devices still beating", func() bool { return ownedDevices(t, a) == users-quiet })
	time.Sleep(time.Second)
	mu.Lock()
	defer mu.Unlock()
	for i := range users {
		u := fmt.Sprintf("u%d", i)
		want := "[offline>online]"
		if i < quiet {
			want = "[offline>online online>offline]"
		}
		if got := fmt.Sprint(changes[u]); got != want {
			t.Errorf("%s: %s, want %s", u, got, want)
		}
	}
}

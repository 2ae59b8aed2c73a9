package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/wire"
)

// TestKafka: a node with Kafka brokers applies the session events of the
// ingest topic and produces each change it makes to the changes topic,
// keyed by user, with rising versions — on the embedded node, and on a
// node with NATS too, where both ingests run at once.
func TestKafka(t *testing.T) {
	for _, withNATS := range []bool{false, true} {
		name := "embedded"
		if withNATS {
			name = "with NATS"
		}
		t.Run(name, func(t *testing.T) { testKafka(t, withNATS) })
	}
}

func testKafka(t *testing.T, withNATS bool) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "presence.updates", "presence.changes"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	cfg := app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
		KafkaBrokers: cluster.ListenAddrs(), Logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	var nsrv *testsvc.Server
	if withNATS {
		nsrv = testsvc.NATS(t)
		cfg.NATSURL = nsrv.URL
	}
	addr := runNode(t, cfg)

	gw, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic("presence.updates"))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	produce := func(typ, user string) {
		t.Helper()
		v := fmt.Appendf(nil, `{"type":%q,"user_id":%q,"device_id":"tab","at":%q}`, typ, user, time.Now().UTC().Format(wire.TimeLayout))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gw.ProduceSync(ctx, &kgo.Record{Key: []byte(user), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	reads := func(user, want string) func() bool {
		return func() bool {
			_, body := call(t, addr, "GET", "/presence/batch?user_ids="+user, "")
			return strings.TrimSpace(body) == fmt.Sprintf(`{%q:%q}`, user, want)
		}
	}

	produce("session_connected", "kim")
	testwait.For(t, "kim online through Kafka", reads("kim", "online"))
	if code, body := call(t, addr, "POST", "/v1/status", `{"user_id":"kim","status":"busy"}`); code != 200 {
		t.Fatalf("status: %d %s", code, body)
	}
	produce("session_disconnected", "kim")
	testwait.For(t, "kim offline through Kafka", reads("kim", "offline"))
	want := map[string][]string{"kim": {"online", "busy", "offline"}}

	if withNATS {
		nc, err := nats.Connect(nsrv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		v := fmt.Sprintf(`{"type":"session_connected","user_id":"lee","device_id":"tab","at":%q}`, time.Now().UTC().Format(wire.TimeLayout))
		if _, err := js.Publish(ctx, "presence.ingest.gw1", []byte(v)); err != nil {
			t.Fatal(err)
		}
		testwait.For(t, "lee online through NATS", reads("lee", "online"))
		want["lee"] = []string{"online"}
	}

	// The changes topic: each change of this node once, keyed by user,
	// versions rising.
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("presence.changes"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var mu sync.Mutex
	got := map[string][]string{}
	last := map[string]uint64{}
	n := 0
	for u := range want {
		n += len(want[u])
	}
	testwait.For(t, "the changes on Kafka", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			var c struct {
				UserID  string `json:"user_id"`
				Status  string `json:"status"`
				Version uint64 `json:"version"`
			}
			if err := json.Unmarshal(r.Value, &c); err != nil || string(r.Key) != c.UserID || c.Version <= last[c.UserID] {
				t.Errorf("change %s keyed %q (err %v; last version %d)", r.Value, r.Key, err, last[c.UserID])
			}
			mu.Lock()
			got[c.UserID] = append(got[c.UserID], c.Status)
			last[c.UserID] = c.Version
			mu.Unlock()
		})
		mu.Lock()
		defer mu.Unlock()
		m := 0
		for _, s := range got {
			m += len(s)
		}
		return m >= n
	})
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("changes on Kafka %v, want %v", got, want)
	}

	// A consumer may read a record before the producer has handled the
	// broker's acknowledgement of it, which is when it counts as produced:
	// wait for the counts rather than read them once.
	series := []string{
		`presenced_kafka_ingest_events_total{outcome="applied"} 2`,
		"presenced_kafka_ingest_partitions 2",
		fmt.Sprintf("presenced_kafka_changes_produced_total %d", n),
		"presenced_kafka_changes_queued 0",
	}
	missing := ""
	testwait.Forf(t, func() string { return fmt.Sprintf("/metrics to have %q", missing) }, func() bool {
		_, metrics := call(t, addr, "GET", "/metrics", "")
		missing = ""
		for _, s := range series {
			if !strings.Contains(metrics, s) {
				missing = s
				return false
			}
		}
		return true
	})
	if _, body := call(t, addr, "GET", "/readyz", ""); !strings.Contains(body, `"kafka":"ok"`) {
		t.Errorf("/readyz %s, want kafka ok", body)
	}
}

// On a scale-out node the devices of the Kafka ingest are the node's own,
// as its sockets' are: a beat through Kafka shows the user online and
// the device owned by the node; a disconnect ends it.
func TestKafkaIngestDevicesOwnedOnRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Redis, PostgreSQL and NATS")
	}
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "presence.updates", "presence.changes"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	rs, pg, ns := testsvc.Redis(t), testsvc.Postgres(t), testsvc.NATS(t)
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
		RedisURL: rs.URL, PostgresURL: pg.URL, NATSURL: ns.URL, NodeID: "node-k",
		KafkaBrokers: cluster.ListenAddrs(), Logger: slog.New(slog.NewTextHandler(t.Output(), nil))})
	gw, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.DefaultProduceTopic("presence.updates"))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	produce := func(typ string) {
		t.Helper()
		v := fmt.Appendf(nil, `{"type":%q,"user_id":"kim","device_id":"tab","at":%q}`, typ, time.Now().UTC().Format(wire.TimeLayout))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gw.ProduceSync(ctx, &kgo.Record{Key: []byte("kim"), Value: v}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	state := func(status string, owned int) func() bool {
		return func() bool {
			_, body := call(t, addr, "GET", "/presence/batch?user_ids=kim", "")
			_, metrics := call(t, addr, "GET", "/metrics", "")
			return strings.TrimSpace(body) == fmt.Sprintf(`{"kim":%q}`, status) &&
				strings.Contains(metrics, fmt.Sprintf("\npresenced_owned_devices %d\n", owned))
		}
	}
	produce("session_connected")
	testwait.For(t, "kim online through Kafka, her device the node's", state("online", 1))
	produce("heartbeat")
	produce("session_disconnected")
	testwait.For(t, "kim offline, no device owned", state("offline", 0))
}

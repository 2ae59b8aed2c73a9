package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/storetest"
	"github.com/presenced/presenced/internal/tracker"
)

// redisURL is the Redis the tests use: $PRESENCED_TEST_REDIS or the
// machine's Redis. Each test works under its own key prefix and deletes
// only its own keys.
func redisURL() string {
	if u := os.Getenv("PRESENCED_TEST_REDIS"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379"
}

// client returns a client of the test Redis, closed at the end of the test.
func client(t testing.TB) rueidis.Client {
	t.Helper()
	c, err := redisstore.Dial(redisURL())
	if err != nil {
		t.Skipf("no Redis at %s: %v", redisURL(), err)
	}
	t.Cleanup(c.Close)
	return c
}

// prefix returns a fresh key prefix and deletes its keys at the end of the test.
func prefix(t testing.TB, c rueidis.Client) string {
	t.Helper()
	b := make([]byte, 8)
	rand.Read(b)
	p := "presenced-test:" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() { deleteKeys(t, c, p) })
	return p
}

func deleteKeys(t testing.TB, c rueidis.Client, p string) {
	ctx := context.Background()
	var cursor uint64
	for {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(p+"*").Count(1000).Build()).AsScanEntry()
		if err != nil {
			t.Logf("cleanup of %s: %v", p, err)
			return
		}
		if len(e.Elements) > 0 {
			cmds := make(rueidis.Commands, len(e.Elements))
			for i, k := range e.Elements {
				cmds[i] = c.B().Unlink().Key(k).Build()
			}
			c.DoMulti(ctx, cmds...)
		}
		if cursor = e.Cursor; cursor == 0 {
			return
		}
	}
}

func newStore(t testing.TB, c rueidis.Client, cfg redisstore.Config) *redisstore.Store {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = prefix(t, c)
	}
	s, err := redisstore.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	c := client(t)
	for _, shards := range []int{1, 256} {
		t.Run(map[int]string{1: "one shard", 256: "256 shards"}[shards], func(t *testing.T) {
			storetest.Run(t, func(t *testing.T, r presence.Rules) tracker.Store {
				// Keep users for the whole length of the suite's scenarios.
				return newStore(t, c, redisstore.Config{Rules: r, Shards: shards, EvictAfter: 1000 * time.Hour})
			})
		})
	}
}

package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// TestRoomsAfterRedisLostItsData: Redis comes back empty (FLUSHALL) under
// a node whose sockets are in rooms. The node claims its devices again,
// and joins again the rooms its connections joined: their clients, still
// connected, would never send the joins themselves.
func TestRoomsAfterRedisLostItsData(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Redis and PostgreSQL")
	}
	rs, pg := testsvc.Redis(t), testsvc.Postgres(t)
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
		RedisURL: rs.URL, PostgresURL: pg.NewDatabase(t), NoIngest: true})
	count := func(room string) int {
		code, body := call(t, addr, "GET", "/v1/rooms?ids="+room, "")
		if code != 200 {
			return -1 // Redis answers nothing yet
		}
		var m map[string]int
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("counts: %s", body)
		}
		return m[room]
	}
	erin := dialRooms(t, addr, "erin", "*")
	erin.send(`{"type":"join","room":"doc-1"}`)
	erin.send(`{"type":"join","room":"doc-2"}`)
	erin.send(`{"type":"leave","room":"doc-2"}`)
	testwait.Forf(t, func() string { return fmt.Sprintf("erin in doc-1 (%d)", count("doc-1")) }, func() bool { return count("doc-1") == 1 })

	c, err := redisstore.Dial(rs.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Do(context.Background(), c.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	flushed := time.Now()
	testwait.Forf(t, func() string { return fmt.Sprintf("erin back in doc-1 (%d)", count("doc-1")) }, func() bool { return count("doc-1") == 1 })
	t.Logf("erin was in doc-1 again %s after Redis lost its data", time.Since(flushed).Round(time.Millisecond))
	if n := count("doc-2"); n != 0 {
		t.Errorf("doc-2, which erin left before, counts %d after the rejoin", n)
	}
}

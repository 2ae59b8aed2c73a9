package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/wsframe"
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
	// Her messages are applied in order: the answer to a subscribe after
	// them says the leave is done, so the data is lost only after it.
	erin.send(`{"type":"subscribe","user_ids":["zed"]}`)
	erin.msg("snapshot")
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

// TestRoomsThroughARedisHang: Redis hangs (SIGSTOP) under a node whose
// sockets are in a room. A join meanwhile is refused with an error (a user
// action, not buffered: the client retries); a socket that closes meanwhile
// leaves once Redis answers again, once; the count is never below zero
// and right at the end.
func TestRoomsThroughARedisHang(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: starts Redis and PostgreSQL")
	}
	rs, pg := testsvc.Redis(t), testsvc.Postgres(t)
	addr := runNode(t, app.Config{DataDir: t.TempDir(), APIKey: testKey, JWTSecret: testSecret, PollInterval: -1,
		RedisURL: rs.URL, PostgresURL: pg.NewDatabase(t), NoIngest: true, CloseGrace: 300 * time.Millisecond})
	watcher := dialRooms(t, addr, "carol", "*")
	watcher.send(`{"type":"watch_room","room":"doc"}`)
	watcher.msg("room")
	erin := dialRooms(t, addr, "erin", "*")
	erin.send(`{"type":"join","room":"doc"}`)
	if got := watcher.roomChange(); got != "join erin online 1" {
		t.Fatalf("erin's join: %q", got)
	}
	bob := dialRooms(t, addr, "bob", "*")
	bob.send(`{"type":"join","room":"doc"}`)
	if got := watcher.roomChange(); got != "join bob online 2" {
		t.Fatalf("bob's join: %q", got)
	}

	if err := rs.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = rs.Resume()
		}
	}()
	bob.nc.Close() // no bye: his device ends after the close grace, told to Redis when it answers
	erin.send(`{"type":"join","room":"doc-2"}`)
	m := erin.msg("error")
	if m["code"] != "unavailable" {
		t.Fatalf("a join while Redis hangs: %v", m)
	}
	time.Sleep(time.Second) // the hang outlasts bob's close grace
	if err := rs.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	erin.send(`{"type":"join","room":"doc-2"}`)
	var last string
	refused := 0
	testwait.Forf(t, func() string { return "bob's leave and erin's retried join: " + last }, func() bool {
		// The node may not have seen Redis back yet: erin sends her join
		// again while it is refused as unavailable, as a client does.
		_ = erin.nc.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if f, err := wsframe.Read(erin.r); err == nil {
			var m map[string]any
			if json.Unmarshal(f.Payload, &m) == nil && m["type"] == "error" && m["code"] == "unavailable" {
				refused++
				erin.send(`{"type":"join","room":"doc-2"}`)
			}
		}
		_ = erin.nc.SetReadDeadline(time.Time{})
		code, body := call(t, addr, "GET", "/v1/rooms?ids=doc,doc-2", "")
		last = fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
		return code == 200 && body == "{\"doc\":1,\"doc-2\":1}\n"
	})
	t.Logf("erin's join after the hang was refused %d times before the node saw Redis back", refused)
	// What carol was sent since the hang, for 3 s more (the resync after
	// the recovery comes 2 s after it): bob's leave once, and maybe a
	// fresh snapshot; never a count below zero.
	leaves := 0
	deadline := time.Now().Add(3 * time.Second)
	for {
		_ = watcher.nc.SetReadDeadline(deadline)
		f, err := wsframe.Read(watcher.r)
		if err != nil {
			break // the window is over
		}
		var m map[string]any
		if f.Header.OpCode != ws.OpText || json.Unmarshal(f.Payload, &m) != nil {
			continue
		}
		if n, _ := m["count"].(float64); n < 0 {
			t.Errorf("a count below zero: %s", f.Payload)
		}
		switch m["type"] {
		case "room_change":
			if m["event"] == "leave" && m["user_id"] == "bob" {
				leaves++
			} else {
				t.Errorf("after the hang: %s", f.Payload)
			}
		case "room":
			if m["count"] != 1.0 {
				t.Errorf("a snapshot after the hang: %s", f.Payload)
			}
		}
	}
	if leaves != 1 {
		t.Errorf("bob's leave was sent %d times, want once", leaves)
	}
}

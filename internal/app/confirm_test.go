package app

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/sqlitestore"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/webhook"
)

// TestConfirmingHeartbeatAllocs: with webhooks on, a heartbeat that
// changes nothing still waits for nothing and allocates nothing, over
// HTTP and through a socket.
func TestConfirmingHeartbeatAllocs(t *testing.T) {
	ctx := context.Background()
	db, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: filepath.Join(t.TempDir(), "presenced.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	hooks, err := webhook.New(ctx, webhook.Config{URLs: []string{"http://127.0.0.1:1/"}, Secret: []byte("secret"), Outbox: db})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := tracker.New(tracker.Config{Store: memstore.New(memstore.Config{}), Durable: db, Publisher: hooks})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { hooks.Run(rctx); close(done) }()
	defer func() { stop(); <-done }()
	c := confirming{tr, hooks}
	if ch, err := c.Heartbeat(ctx, "u1", "d1", true); err != nil || !ch.Changed {
		t.Fatalf("first heartbeat: %+v, %v", ch, err)
	}
	for name, beat := range map[string]func(){
		"Heartbeat":  func() { _, _ = c.Heartbeat(ctx, "u1", "d1", true) },
		"SocketBeat": func() { _, _ = c.SocketBeat(ctx, "u1", "d1", true) },
	} {
		if allocs := testing.AllocsPerRun(1000, beat); allocs != 0 {
			t.Errorf("%s that changes nothing allocates %.1f times, want 0", name, allocs)
		}
	}
	if st := hooks.Stats(); st.Unconfirmed != 0 {
		t.Errorf("stats %+v: the first heartbeat's change was not confirmed", st)
	}
}

// TestConfirmingSkipsSelfOnly: a change only the user sees (an invisible
// user's text) is sent to no webhook, so its answer waits for no log: it
// leaves the count of unconfirmed changes alone while the log confirms
// nothing (here: the Sender is not run, so its outbox is never written).
func TestConfirmingSkipsSelfOnly(t *testing.T) {
	ctx := context.Background()
	db, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: filepath.Join(t.TempDir(), "presenced.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	hooks, err := webhook.New(ctx, webhook.Config{URLs: []string{"http://127.0.0.1:1/"}, Secret: []byte("secret"), Outbox: db,
		ConfirmTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := tracker.New(tracker.Config{Store: memstore.New(memstore.Config{}), Durable: db, Publisher: hooks})
	if err != nil {
		t.Fatal(err)
	}
	c := confirming{tr, hooks}
	if ch, err := c.Heartbeat(ctx, "u1", "d1", true); err != nil || !ch.Changed {
		t.Fatalf("first heartbeat: %+v, %v", ch, err)
	}
	if ch, err := c.SetStatus(ctx, "u1", presence.ManualInvisible, "lunch"); err != nil || !ch.Changed || ch.Event.SelfOnly {
		t.Fatalf("going invisible: %+v, %v", ch, err)
	}
	if st := hooks.Stats(); st.Unconfirmed != 2 {
		t.Fatalf("stats %+v: want the 2 changes so far unconfirmed (the outbox is not written)", st)
	}
	ch, err := c.SetStatus(ctx, "u1", presence.ManualInvisible, "gone fishing")
	if err != nil || !ch.Changed || !ch.Event.SelfOnly {
		t.Fatalf("a text while invisible: %+v, %v; want a change only the user sees", ch, err)
	}
	if st := hooks.Stats(); st.Unconfirmed != 2 {
		t.Errorf("stats %+v: the change only the user sees waited for the webhooks' log", st)
	}
}

// TestConfirmingRooms: a join or leave waits for the webhooks' log as a
// change does (here the Sender is not run: each wait runs out and is
// counted unconfirmed); a join that changed nothing waits for nothing.
func TestConfirmingRooms(t *testing.T) {
	ctx := context.Background()
	db, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: filepath.Join(t.TempDir(), "presenced.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	hooks, err := webhook.New(ctx, webhook.Config{URLs: []string{"http://127.0.0.1:1/"}, Secret: []byte("secret"), Outbox: db,
		ConfirmTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := tracker.New(tracker.Config{Store: memstore.New(memstore.Config{}), Durable: db, Publisher: hooks})
	if err != nil {
		t.Fatal(err)
	}
	c := confirming{tr, hooks}
	if _, err := c.Heartbeat(ctx, "u1", "d1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Heartbeat(ctx, "u1", "d2", true); err != nil {
		t.Fatal(err)
	}
	before := hooks.Stats().Unconfirmed
	if _, err := c.Join(ctx, "u1", "d1", "doc"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Join(ctx, "u1", "d1", "doc"); err != nil { // in it already
		t.Fatal(err)
	}
	if n := hooks.Stats().Unconfirmed - before; n != 1 {
		t.Fatalf("a join and a repeated join: %d waits ran out, want 1", n)
	}
	// The bye of d1 leaves doc while u1 stays online on d2: it waits too.
	if ch, err := c.Bye(ctx, "u1", "d1"); err != nil || ch.Changed || len(ch.Rooms) != 1 {
		t.Fatalf("bye: %+v %v", ch, err)
	}
	if n := hooks.Stats().Unconfirmed - before; n != 2 {
		t.Fatalf("after the bye that left a room: %d waits ran out, want 2", n)
	}
}

// Only the embedded node without webhooks lets the epoll loop apply
// beats: with Redis or webhooks a beat may wait, and a hung backend must
// not stall every socket's reads.
func TestBeatsMayWait(t *testing.T) {
	for _, tc := range []struct {
		redis    string
		webhooks bool
		want     bool
	}{
		{"", false, false},
		{"", true, true},
		{"redis://127.0.0.1:6379/0", false, true},
		{"redis://127.0.0.1:6379/0", true, true},
	} {
		if got := beatsMayWait(Config{RedisURL: tc.redis}, tc.webhooks); got != tc.want {
			t.Errorf("redis %q, webhooks %v: beats may wait %v, want %v", tc.redis, tc.webhooks, got, tc.want)
		}
	}
}

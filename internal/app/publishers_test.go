package app

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/sqlitestore"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/webhook"
)

// changesOnly is a Publisher that takes no room events.
type changesOnly struct{ n int }

func (c *changesOnly) Publish(*presence.Event) { c.n++ }

// roomLog is a Publisher that keeps the room events it is handed.
type roomLog struct {
	changesOnly
	mu    sync.Mutex
	rooms []string
}

func (r *roomLog) PublishRoom(ev *presence.RoomEvent) {
	r.mu.Lock()
	r.rooms = append(r.rooms, ev.Kind.String()+" "+ev.UserID+" "+ev.Room)
	r.mu.Unlock()
}

// TestPublishersForwardRooms: the tracker's joins and leaves reach every
// publisher that takes room events — here a recorder and the webhooks'
// outbox, which logs them before Confirm returns — and a publisher of
// changes alone is left out of them.
func TestPublishersForwardRooms(t *testing.T) {
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
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { hooks.Run(rctx); close(done) }()
	defer func() { stop(); <-done }()
	plain, rec := &changesOnly{}, &roomLog{}
	tr, err := tracker.New(tracker.Config{Store: memstore.New(memstore.Config{}), Durable: db,
		Publisher: publishers{plain, rec, hooks}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Heartbeat(ctx, "ann", "d1", true); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Join(ctx, "ann", "d1", "doc"); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Leave(ctx, "ann", "d1", "doc"); err != nil {
		t.Fatal(err)
	}
	if !hooks.Confirm(ctx) {
		t.Fatal("Confirm: false")
	}
	rec.mu.Lock()
	got := strings.Join(rec.rooms, ", ")
	rec.mu.Unlock()
	if want := "join ann doc, leave ann doc"; got != want {
		t.Errorf("room events %q, want %q", got, want)
	}
	if plain.n != 1 || rec.n != 1 {
		t.Errorf("changes published %d and %d times, want 1 each", plain.n, rec.n)
	}
	var logged []string
	if err := db.ReadOutbox(ctx, 0, 10, func(_ uint64, data []byte) { logged = append(logged, string(data)) }); err != nil {
		t.Fatal(err)
	}
	if len(logged) != 3 || !strings.HasPrefix(logged[1], `{"room":"doc","user_id":"ann","event":"join"`) ||
		!strings.HasPrefix(logged[2], `{"room":"doc","user_id":"ann","event":"leave"`) {
		t.Errorf("the outbox holds %q, want the change, the join and the leave", logged)
	}
}

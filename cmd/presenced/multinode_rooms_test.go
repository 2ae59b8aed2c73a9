package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	wsclient "github.com/presenced/presenced/client"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/testwait"
)

// dialRooms connects a client of user (device, or a generated one) to n
// with a token that allows every room.
func dialRooms(t *testing.T, n *proc, user, device string) *wsclient.Client {
	t.Helper()
	tok, err := auth.Token{User: user, Rooms: []string{"*"}}.Sign([]byte(clusterSecret), time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return dialToken(t, n, user, device, tok)
}

// roomSeen is what one client watching rooms received, in order.
type roomSeen struct {
	mu      sync.Mutex
	changes []wsclient.RoomChange
	counts  map[string]int // the last count of each room
	neg     []string       // counts below zero, ever
}

// roomWatcher connects user on n and watches rooms, each from its
// snapshot on.
func roomWatcher(t *testing.T, n *proc, user string, rooms ...string) *roomSeen {
	t.Helper()
	c := dialRooms(t, n, user, "")
	s := &roomSeen{counts: map[string]int{}}
	snap := make(chan string, len(rooms))
	go func() {
		for u := range c.Updates() {
			s.mu.Lock()
			switch u := u.(type) {
			case wsclient.RoomSnapshot:
				s.counts[u.Room] = u.Count
				snap <- u.Room
			case wsclient.RoomChange:
				s.changes = append(s.changes, u)
				s.counts[u.Room] = u.Count
				if u.Count < 0 {
					s.neg = append(s.neg, fmt.Sprintf("%s %d", u.Room, u.Count))
				}
			}
			s.mu.Unlock()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	for _, r := range rooms {
		if err := c.WatchRoom(ctx, r); err != nil {
			t.Fatal(err)
		}
		select {
		case <-snap:
		case <-ctx.Done():
			t.Fatalf("%s: no snapshot of %s", user, r)
		}
	}
	return s
}

// of returns "kind user status" of the live changes of room seen so far.
func (s *roomSeen) of(room string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, c := range s.changes {
		if c.Room == room && !c.Snapshot {
			out = append(out, fmt.Sprintf("%s %s %s", c.Kind, c.UserID, c.Status))
		}
	}
	return out
}

func (s *roomSeen) count(room string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[room]
}

func (s *roomSeen) await(t *testing.T, who, room string, want ...string) {
	t.Helper()
	testwait.Forf(t, func() string { return fmt.Sprintf("%s: %s to show %q; it shows %q", who, room, want, s.of(room)) },
		func() bool { return slices.Equal(s.of(room), want) })
}

// streamRoomEvents returns "event user reason" of every event of room
// the changes stream holds.
func streamRoomEvents(t *testing.T, natsURL string) map[string][]string {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, "PRESENCE_CHANGES")
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		if !strings.HasPrefix(m.Subject, "presence.changes.r.") {
			continue
		}
		var ev struct {
			Room   string `json:"room"`
			UserID string `json:"user_id"`
			Event  string `json:"event"`
			Reason string `json:"reason"`
			Count  int    `json:"count"`
		}
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("message %d: %v", seq, err)
		}
		if ev.Count < 0 {
			t.Errorf("a negative count on the stream: %s", m.Data)
		}
		out[ev.Room] = append(out[ev.Room], ev.Event+" "+ev.UserID+" "+ev.Reason)
	}
	return out
}

// Rooms across three nodes: members on one node, watchers on the others
// see joins, statuses and leaves; node 3 is killed while two users' devices
// are in twenty rooms: the one who reconnects to node 2 within the ttl
// leaves nothing, the other leaves each room exactly once — on every
// watcher and on the changes stream — when its user goes offline.
func TestRoomsThreeNodes(t *testing.T) {
	t.Parallel()
	b := newBackends(t)
	nodes := b.nodes(t, 3)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	var rooms []string
	for i := range 20 {
		rooms = append(rooms, fmt.Sprint("room-", i))
	}
	w1 := roomWatcher(t, n1, "w1", rooms...)
	w2 := roomWatcher(t, n2, "w2", rooms...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()

	// bob on node 3 joins room-0 and turns busy: seen on nodes 1 and 2.
	bob := dialRooms(t, n3, "bob", "phone")
	if err := bob.Join(ctx, "room-0"); err != nil {
		t.Fatal(err)
	}
	w1.await(t, "w1", "room-0", "join bob online")
	if err := bob.SetStatus(ctx, wsclient.Busy, ""); err != nil {
		t.Fatal(err)
	}
	for name, w := range map[string]*roomSeen{"w1": w1, "w2": w2} {
		w.await(t, name, "room-0", "join bob online", "status bob busy")
	}
	if err := bob.Bye(ctx); err != nil {
		t.Fatal(err)
	}
	for name, w := range map[string]*roomSeen{"w1": w1, "w2": w2} {
		w.await(t, name, "room-0", "join bob online", "status bob busy", "leave bob ")
	}

	// carol and dave on node 3, each in all twenty rooms.
	carol := dialRooms(t, n3, "carol", "laptop")
	dave := dialRooms(t, n3, "dave", "tablet")
	for _, r := range rooms {
		if err := carol.Join(ctx, r); err != nil {
			t.Fatal(err)
		}
		if err := dave.Join(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range rooms {
		testwait.Forf(t, func() string { return fmt.Sprintf("w1: %s at 2 members (%d)", r, w1.count(r)) },
			func() bool { return w1.count(r) == 2 && w2.count(r) == 2 })
	}
	wd := watcher(t, n1, "w3", "dave")
	wd.await(t, "w3", "dave", wsclient.Online)
	n3.signal(t, syscall.SIGKILL)
	n3.wait(t)
	killed := time.Now()
	carol.Close()
	carol2 := dialRooms(t, n2, "carol", "laptop")
	for _, r := range rooms {
		if err := carol2.Join(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range rooms {
		for name, w := range map[string]*roomSeen{"w1": w1, "w2": w2} {
			testwait.Forf(t, func() string { return fmt.Sprintf("%s: %s at carol alone (%d): %q", name, r, w.count(r), w.of(r)) },
				func() bool { return w.count(r) == 1 })
		}
	}
	left := time.Since(killed)
	wd.await(t, "w3", "dave", wsclient.Offline)
	offline := wd.of("dave")[len(wd.of("dave"))-1].at.Sub(killed)
	t.Logf("dave left twenty rooms on both surviving nodes %s after node 3 was killed; his offline reached node 1 %s after it",
		left.Round(time.Millisecond), offline.Round(time.Millisecond))
	testwait.NothingWithin(2*time.Second, "a second leave of dave, or a leave of carol")
	for name, w := range map[string]*roomSeen{"w1": w1, "w2": w2} {
		for _, r := range rooms {
			got := w.of(r)
			want := []string{"join carol online", "join dave online", "leave dave "}
			if r == "room-0" {
				want = append([]string{"join bob online", "status bob busy", "leave bob "}, want...)
			}
			// carol's and dave's joins may reach a watcher in either order.
			if len(got) == len(want) && len(got) >= 3 && got[len(got)-3] != want[len(want)-3] {
				got[len(got)-3], got[len(got)-2] = got[len(got)-2], got[len(got)-3]
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s: %s showed %q, want %q", name, r, got, want)
			}
		}
		if len(w.neg) > 0 {
			t.Errorf("%s: negative counts %q", name, w.neg)
		}
	}
	// The stream: each of dave's rooms one join and one leave (ended).
	stream := streamRoomEvents(t, b.nats.URL)
	for _, r := range rooms {
		var dv []string
		for _, e := range stream[r] {
			if strings.Contains(e, " dave ") {
				dv = append(dv, e)
			}
			if strings.HasPrefix(e, "leave carol") {
				t.Errorf("%s: carol left on the stream: %q", r, stream[r])
			}
		}
		if !slices.Equal(dv, []string{"join dave joined", "leave dave ended"}) {
			t.Errorf("%s: dave on the stream %q, want one join and one leave", r, dv)
		}
	}
}

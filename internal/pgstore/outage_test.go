package pgstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
)

// TestOutage: while PostgreSQL is down every method fails (the tracker
// keeps the checkpoint and retries it); once it is back the same store
// works again without being reopened, and nothing committed is lost.
func TestOutage(t *testing.T) {
	for _, how := range []string{"stop", "kill"} {
		t.Run(how, func(t *testing.T) {
			srv := testsvc.Postgres(t)
			s := open(t, srv.NewDatabase(t))
			ctx := t.Context()

			checkpoint := func(round int64) []presence.Profile {
				batch := make([]presence.Profile, 500)
				for i := range batch {
					batch[i] = presence.Profile{UserID: fmt.Sprintf("u%03d", i), LastSeen: round*1000 + int64(i), PubLastSeen: round, Version: uint64(round)}
				}
				return batch
			}
			if err := s.SaveLastSeen(ctx, checkpoint(1)); err != nil {
				t.Fatalf("SaveLastSeen before the outage: %v", err)
			}
			if err := s.SetContacts(ctx, "u000", []string{"u001", "u002"}); err != nil {
				t.Fatal(err)
			}

			stop := srv.Stop
			if how == "kill" {
				stop = srv.Kill
			}
			if err := stop(); err != nil {
				t.Fatalf("%s the server: %v", how, err)
			}
			down, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := s.SaveLastSeen(down, checkpoint(2)); err == nil {
				t.Fatalf("SaveLastSeen while the server is down: got nil error, want one")
			}
			if err := s.Ping(down); err == nil {
				t.Errorf("Ping while the server is down: got nil error, want one")
			}
			if err := s.LoadProfiles(down, []string{"u000"}, func(*presence.Profile) {}); err == nil {
				t.Errorf("LoadProfiles while the server is down: got nil error, want one")
			}
			if err := s.SaveStatus(down, "u000", presence.ManualBusy, ""); err == nil {
				t.Errorf("SaveStatus while the server is down: got nil error, want one")
			}
			if _, err := s.Contacts(down, "u000"); err == nil {
				t.Errorf("Contacts while the server is down: got nil error, want one")
			}

			if err := srv.Start(); err != nil {
				t.Fatalf("restart the server: %v", err)
			}
			// The tracker retries the checkpoint it could not write; the
			// first tries may meet connections broken by the outage.
			testwait.NoErr(t, "SaveLastSeen after the restart", func() error { return s.SaveLastSeen(ctx, checkpoint(2)) })
			if err := s.Ping(ctx); err != nil {
				t.Errorf("Ping after the restart: %v", err)
			}

			want := checkpoint(2)
			ids := make([]string, len(want))
			for i := range want {
				ids[i] = want[i].UserID
			}
			got := make(map[string]presence.Profile)
			if err := s.LoadProfiles(ctx, ids, func(p *presence.Profile) { got[p.UserID] = *p }); err != nil {
				t.Fatal(err)
			}
			for _, w := range want {
				if g := got[w.UserID]; g != w {
					t.Fatalf("%s after the restart\n got %+v\nwant %+v", w.UserID, g, w)
				}
			}
			if c, err := s.Contacts(ctx, "u000"); err != nil || len(c) != 2 {
				t.Errorf("Contacts after the restart = %q, %v; want [u001 u002]", c, err)
			}
		})
	}
}

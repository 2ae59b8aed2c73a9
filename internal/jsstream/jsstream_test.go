package jsstream_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/presenced/presenced/internal/jsstream"
	"github.com/presenced/presenced/internal/testsvc"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

func connect(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func config(name string) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:       name,
		Subjects:   []string{strings.ToLower(name) + ".>"},
		Storage:    jetstream.FileStorage,
		MaxAge:     time.Hour,
		Duplicates: time.Minute,
	}
}

// Nodes starting together each declare the same streams on a fresh server
// at the same moment. nats-server 2.9 crashed when an update request met
// a stream another connection was still creating (the old code updated
// first); it must stay up, and every Ensure must succeed. (nats-server 2.9
// also sometimes stops answering concurrent creates of one stream,
// nats-io/nats-server#3677; on 2.9 such a round is logged, not failed —
// scripts/test.sh runs a current release.)
func TestConcurrentEnsureOnAFreshServer(t *testing.T) {
	const rounds, nodes = 100, 4
	for round := range rounds {
		srv, err := testsvc.StartNATS()
		if err != nil {
			testsvc.Fatal(t, err)
		}
		nc, err := nats.Connect(srv.URL, nats.MaxReconnects(0))
		if err != nil {
			t.Fatal(err)
		}
		old := strings.HasPrefix(nc.ConnectedServerVersion(), "2.9.")
		nc.Close()
		jss := make([]jetstream.JetStream, nodes)
		for i := range jss {
			jss[i] = connect(t, srv.URL)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		start := make(chan struct{})
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			errs    []error
			timeout bool
		)
		for _, js := range jss {
			for _, name := range []string{"CHANGES", "INGEST"} {
				wg.Go(func() {
					<-start
					if err := jsstream.Ensure(ctx, js, config(name)); err != nil {
						mu.Lock()
						errs = append(errs, err)
						timeout = timeout || errors.Is(err, context.DeadlineExceeded)
						mu.Unlock()
					}
				})
			}
		}
		close(start)
		wg.Wait()
		cancel()
		if !srv.Running() {
			t.Fatalf("round %d: nats-server died:\n%s", round, srv.LogTail(60))
		}
		switch {
		case len(errs) > 0 && old && timeout:
			t.Logf("round %d: nats-server 2.9 did not answer concurrent creates (nats-server#3677): %v", round, errs[0])
		case len(errs) > 0:
			t.Fatalf("round %d: %v", round, errors.Join(errs...))
		}
		srv.Close()
	}
}

// dropper is a Creator whose server leaves the first create unanswered
// and answers the next ones with success.
type dropper struct {
	mu      sync.Mutex
	creates int
}

func (d *dropper) CreateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	d.mu.Lock()
	d.creates++
	first := d.creates == 1
	d.mu.Unlock()
	if first {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, nil
}

func (d *dropper) UpdateStream(context.Context, jetstream.StreamConfig) (jetstream.Stream, error) {
	return nil, errors.New("no update expected")
}

// A create the server never answers is sent again while the caller still
// waits, instead of waiting out the caller's whole deadline.
func TestEnsureSendsAnUnansweredCreateAgain(t *testing.T) {
	d := &dropper{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := jsstream.Ensure(ctx, d, config("CHANGES")); err != nil {
		t.Fatal(err)
	}
	if d.creates != 2 {
		t.Fatalf("sent %d creates, want 2", d.creates)
	}
	// The caller's own deadline still ends it, with the cause.
	d = &dropper{}
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := jsstream.Ensure(short, d, config("CHANGES"))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "CHANGES") {
		t.Fatalf("Ensure past the caller's deadline = %v", err)
	}
}

// A stream left by an older release with another configuration is brought
// to the one asked for; a stream of another name holding the subjects is
// a clear error.
func TestEnsureUpdatesAndRefuses(t *testing.T) {
	srv := testsvc.SharedNATS(t)
	js := connect(t, srv.URL)
	ctx := context.Background()
	name := "S" + strings.ToUpper(testsvc.Unique(t))
	old := config(name)
	old.MaxAge = 2 * time.Hour
	if _, err := js.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { js.DeleteStream(context.Background(), name) })
	if err := jsstream.Ensure(ctx, js, config(name)); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.MaxAge; got != time.Hour {
		t.Fatalf("MaxAge after Ensure = %s, want 1h", got)
	}
	// Ensure again: nothing to change, still fine.
	if err := jsstream.Ensure(ctx, js, config(name)); err != nil {
		t.Fatal(err)
	}

	other := config(name + "X")
	other.Subjects = config(name).Subjects
	err = jsstream.Ensure(ctx, js, other)
	if err == nil || !strings.Contains(err.Error(), name+"X") || !strings.Contains(err.Error(), "overlap") {
		t.Fatalf("Ensure of a stream whose subjects another holds: %v, want an overlap error naming it", err)
	}
	if _, err := js.Stream(ctx, name+"X"); err == nil {
		t.Fatal("the refused stream exists")
	}
}

// Credentials never reach an error message, whatever the form of the URL.
func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                           "nats://127.0.0.1:4222",
		"nats://u:secret@h:4222":                          "nats://***@h:4222",
		"nats://tok@h1:4222,nats://u:secret@h2:4222":      "nats://***@h1:4222,nats://***@h2:4222",
		"nats://h1:4222,nats://u:p@ss@h2:4222":            "nats://h1:4222,nats://***@h2:4222",
		"u:secret@h:4222":                                 "***@h:4222",
		"nats://h1:4222, nats://u:secret@h2:4222,h3:4222": "nats://h1:4222, nats://***@h2:4222,h3:4222",
	} {
		if got := jsstream.RedactURL(in); got != want || strings.Contains(got, "secret") {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// Package apptest runs whole presenced nodes (app.App on a loopback
// listener) for the tests of other packages.
package apptest

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
)

// Start runs a node with cfg on a free port of 127.0.0.1 until stop is
// called; stop returns what Run returned (nil after the first call).
func Start(t testing.TB, cfg app.Config) (a *app.App, addr string, stop func() error) {
	t.Helper()
	a, err := app.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("app.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		a.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, ln) }()
	stopped := false
	return a, ln.Addr().String(), func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
}

// Run runs a node with cfg until the end of the test, which fails if Run
// returns an error, and returns its address (host:port).
func Run(t testing.TB, cfg app.Config) string {
	t.Helper()
	_, addr, stop := Start(t, cfg)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return addr
}

// WaitReady waits until the node at addr answers /readyz with 200, for
// at most 30 s.
func WaitReady(t testing.TB, addr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if res, err := http.Get("http://" + addr + "/readyz"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node at %s did not get ready", addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

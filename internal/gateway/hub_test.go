package gateway_test

import (
	"testing"

	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/sqlitestore"
)

// newHub returns the fan-out hub of a test node.
func newHub(t testing.TB, durable *sqlitestore.Store, maxSubs int) hubRunner {
	t.Helper()
	h, err := fanout.New(fanout.Config{Relations: durable, MaxSubscriptions: maxSubs})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

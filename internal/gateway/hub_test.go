package gateway_test

import (
	"testing"

	"github.com/presenced/presenced/internal/sqlitestore"
)

// newHub returns the fan-out hub of a test node; nil until internal/fanout
// exists.
func newHub(t *testing.T, durable *sqlitestore.Store, maxSubs int) hubRunner { return nil }

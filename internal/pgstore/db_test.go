package pgstore

import (
	"testing"

	"github.com/presenced/presenced/internal/testsvc"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// newDatabase returns the URL of a new, empty database on this test
// binary's private PostgreSQL.
func newDatabase(tb testing.TB) string {
	tb.Helper()
	return testsvc.SharedPostgres(tb).NewDatabase(tb)
}

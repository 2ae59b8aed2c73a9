package sqlitestore

import (
	"path/filepath"
	"testing"

	"github.com/presenced/presenced/internal/durabletest"
)

// TestBackendCallHistograms: every method of the store that reaches the
// database records one call in its presenced_backend_call_duration_seconds
// series (backend="sqlite").
func TestBackendCallHistograms(t *testing.T) {
	durabletest.RunBackendCalls(t, "sqlite", open(t, filepath.Join(t.TempDir(), "presenced.db")))
}

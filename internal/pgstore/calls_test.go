package pgstore

import (
	"testing"

	"github.com/presenced/presenced/internal/durabletest"
)

// TestBackendCallHistograms: every method of the store that reaches the
// database records one call in its presenced_backend_call_duration_seconds
// series (backend="postgres").
func TestBackendCallHistograms(t *testing.T) {
	durabletest.RunBackendCalls(t, "postgres", open(t, newDatabase(t)))
}

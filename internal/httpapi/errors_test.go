package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/writegate"
)

type unavailableErr struct{}

func (unavailableErr) Error() string     { return "buffer full" }
func (unavailableErr) Unavailable() bool { return true }

// TestWriteError pins what a client is told of each kind of error: the
// domain's limits are their own 4xx, anything unexpected a 500 that keeps
// its detail for the server log.
func TestWriteError(t *testing.T) {
	secret := errors.New(`sqlitestore: load profiles: open /var/lib/presenced/presenced.db: disk I/O error`)
	tests := []struct {
		name    string
		err     error
		status  int
		code    string
		message string // exact, or "" to check contains only
		words   []string
	}{
		{"an *Error passes through", badRequest("invalid_id", "user_id: bad"), 400, "invalid_id", "user_id: bad", nil},
		{"a wrapped *Error", fmt.Errorf("ctx: %w", forbidden("no")), 403, "forbidden", "no", nil},
		{"too many devices", fmt.Errorf("heartbeat: %w", presence.ErrTooManyDevices), http.StatusConflict, "too_many_devices", "", []string{"too many devices"}},
		{"too many contacts from the store", fmt.Errorf("sqlitestore: add contacts of %q: %w (the change would make 10002)", "u", presence.ErrTooManyContacts),
			400, "too_many_contacts", "a contact list may hold at most 10000 users", nil},
		{"canceled", fmt.Errorf("load: %w", context.Canceled), 499, "canceled", "", nil},
		{"anything else", secret, 500, "internal", "internal error (details are in the server log)", nil},
		{"anything else, wrapped", fmt.Errorf("set status: %w", secret), 500, "internal", "internal error (details are in the server log)", nil},
		{"deadline: a backend too slow", fmt.Errorf("set status: %w", context.DeadlineExceeded), 503, "unavailable", "", []string{"nothing was changed", "retry"}},
		{"a backend refuses connections", fmt.Errorf("pgstore: save status: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}),
			503, "unavailable", "", []string{"unavailable"}},
		{"an error that says it is temporary", fmt.Errorf("heartbeat: %w", unavailableErr{}), 503, "unavailable", "", nil},
		{"too many contact-list writes waiting", fmt.Errorf("sqlitestore: set contacts of %q: %w", "u", writegate.ErrBusy),
			503, "busy", "too many writes are waiting for the durable store; nothing was changed, retry after Retry-After", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			writeError(w, tc.err)
			if w.Code != tc.status {
				t.Errorf("status: got %d, want %d", w.Code, tc.status)
			}
			var body struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", w.Body, err)
			}
			if body.Error.Code != tc.code {
				t.Errorf("code: got %q, want %q", body.Error.Code, tc.code)
			}
			if tc.message != "" && body.Error.Message != tc.message {
				t.Errorf("message: got %q, want %q", body.Error.Message, tc.message)
			}
			for _, word := range tc.words {
				if !strings.Contains(body.Error.Message, word) {
					t.Errorf("message %q lacks %q", body.Error.Message, word)
				}
			}
			for _, leak := range []string{"sqlitestore", "/var/lib", "disk I/O", "10002"} {
				if strings.Contains(w.Body.String(), leak) {
					t.Errorf("body tells %q: %s", leak, w.Body)
				}
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type: got %q", ct)
			}
			if ra := w.Header().Get("Retry-After"); (tc.status == 503) != (ra != "") {
				t.Errorf("Retry-After %q with status %d", ra, tc.status)
			}
		})
	}
}

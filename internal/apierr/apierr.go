// Package apierr decides, once for every entry point, what a client is told
// of an error: its status, its stable code and its message. The HTTP API
// writes it as {"error":{"code":…,"message":…}} with the status; the
// WebSocket gateway answers a refused upgrade the same way and a failed
// message with {"type":"error","code":…,"message":…}.
//
// Limits of the domain have their own 4xx; decisions on the caller
// (package auth) are 401 or 403; rooms a node's state store does not
// have are 501 rooms_unavailable (no retry helps); a backend that cannot serve for now
// (tracker.Unavailable, the one classification of transient failures) is
// 503 unavailable; anything else unexpected is 500 internal, whose detail
// stays in the server log.
package apierr

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/wire"
	"github.com/presenced/presenced/internal/writegate"
)

// Error is what a client is told: an HTTP status, a stable
// machine-readable code and a message for people.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// New returns an Error with a formatted message.
func New(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// The answers every entry point shares.
var (
	// Unavailable: a backend the request needs does not answer now
	// (PostgreSQL down for a durable write, the node's buffer full while
	// Redis is down); nothing was changed.
	Unavailable = &Error{Status: http.StatusServiceUnavailable, Code: "unavailable",
		Message: "a backend of the service is unavailable; nothing was changed, retry later"}
	// Busy: too many writes of its kind wait for the durable store
	// (contact lists: package writegate); nothing was changed.
	Busy = &Error{Status: http.StatusServiceUnavailable, Code: "busy",
		Message: "too many writes are waiting for the durable store; nothing was changed, retry after Retry-After"}
	// Internal: anything unexpected; the detail is in the server log.
	Internal = &Error{Status: http.StatusInternalServerError, Code: "internal",
		Message: "internal error (details are in the server log)"}
)

// RoomNotAllowed is the 403 of a client whose token's rooms claim does
// not name room.
func RoomNotAllowed(room string) *Error {
	return New(http.StatusForbidden, "room_not_allowed",
		"room %q is not among the rooms this token's rooms claim allows", room)
}

// Classify maps err to what the client is told.
func Classify(err error) *Error {
	var (
		e      *Error
		denied *auth.Denied
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &e):
		return e
	case errors.As(err, &denied):
		return &Error{Status: http.StatusForbidden, Code: "forbidden", Message: denied.Reason}
	case errors.Is(err, auth.ErrNoUser):
		return &Error{Status: http.StatusBadRequest, Code: "invalid_id", Message: err.Error()}
	case errors.Is(err, auth.ErrMissing), errors.Is(err, auth.ErrInvalid):
		return &Error{Status: http.StatusUnauthorized, Code: "unauthorized", Message: err.Error()}
	case errors.Is(err, presence.ErrTooManyDevices):
		return &Error{Status: http.StatusConflict, Code: "too_many_devices",
			Message: presence.ErrTooManyDevices.Error() + ": end one with a bye, or let it expire"}
	case errors.Is(err, presence.ErrTooManyRooms):
		return &Error{Status: http.StatusConflict, Code: "too_many_rooms",
			Message: presence.ErrTooManyRooms.Error() + ": leave one first"}
	case errors.Is(err, presence.ErrDeviceNotAlive):
		return &Error{Status: http.StatusConflict, Code: "device_not_alive", Message: presence.ErrDeviceNotAlive.Error()}
	case errors.Is(err, tracker.ErrRoomsUnsupported):
		// Not 503: the node's configuration, which no retry changes.
		return &Error{Status: http.StatusNotImplemented, Code: "rooms_unavailable", Message: tracker.ErrRoomsUnsupported.Error()}
	case errors.Is(err, presence.ErrTooManyContacts):
		return &Error{Status: http.StatusBadRequest, Code: "too_many_contacts", Message: presence.ErrTooManyContacts.Error()}
	case errors.Is(err, context.Canceled):
		return &Error{Status: 499, Code: "canceled", Message: "the request was canceled"}
	case errors.Is(err, writegate.ErrBusy):
		return Busy
	case tracker.Unavailable(err):
		return Unavailable
	}
	return Internal
}

// AppendJSON appends e as {"error":{"code":…,"message":…}}.
func AppendJSON(b []byte, e *Error) []byte {
	b = append(b, `{"error":{"code":`...)
	b = wire.AppendString(b, e.Code)
	b = append(b, `,"message":`...)
	b = wire.AppendString(b, e.Message)
	return append(b, "}}\n"...)
}

// Write writes what err tells the client as JSON, with Retry-After: 1 on a
// 503 unless the caller set one. Headers the caller set stay.
func Write(w http.ResponseWriter, err error) {
	e := Classify(err)
	b := AppendJSON(make([]byte, 0, 64+len(e.Message)), e)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	if e.Status == http.StatusServiceUnavailable && h.Get("Retry-After") == "" {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(b)
}

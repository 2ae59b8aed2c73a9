package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/wire"
	"github.com/presenced/presenced/internal/writegate"
)

// Error is an error with its HTTP status and a stable machine-readable code.
// It is written as {"error":{"code":"…","message":"…"}}.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

func badRequest(code, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: code, Message: fmt.Sprintf(format, args...)}
}

var (
	errUnauthorized = &Error{Status: http.StatusUnauthorized, Code: "unauthorized"}
	errForbidden    = &Error{Status: http.StatusForbidden, Code: "forbidden"}
)

func forbidden(msg string) *Error {
	return &Error{Status: http.StatusForbidden, Code: errForbidden.Code, Message: msg}
}

func unauthorized(err error) *Error {
	return &Error{Status: http.StatusUnauthorized, Code: errUnauthorized.Code, Message: err.Error()}
}

// classify maps an error to what the client is told. Limits of the
// domain become their own 4xx; a backend that cannot serve for now
// (tracker.Unavailable: the one classification of transient failures) is a
// 503; anything else unexpected is a 500. The detail of a 5xx stays in the
// server log.
func classify(err error) *Error {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, presence.ErrTooManyDevices):
		return &Error{Status: http.StatusConflict, Code: "too_many_devices",
			Message: presence.ErrTooManyDevices.Error() + ": end one with a bye, or let it expire"}
	case errors.Is(err, presence.ErrTooManyContacts):
		return &Error{Status: http.StatusBadRequest, Code: "too_many_contacts", Message: presence.ErrTooManyContacts.Error()}
	case errors.Is(err, context.Canceled):
		return &Error{Status: 499, Code: "canceled", Message: "the request was canceled"}
	case errors.Is(err, writegate.ErrBusy):
		return errBusy
	case tracker.Unavailable(err):
		return errUnavailable
	}
	return &Error{Status: http.StatusInternalServerError, Code: "internal", Message: "internal error (details are in the server log)"}
}

// errUnavailable is the answer while a backend the request needs does not
// answer (PostgreSQL down for a durable write, the node's buffer full
// while Redis is down): nothing was changed, try again.
var errUnavailable = &Error{Status: http.StatusServiceUnavailable, Code: "unavailable",
	Message: "a backend of the service is unavailable; nothing was changed, retry later"}

// errBusy is the answer to a write refused because too many writes of its
// kind wait for the durable store (contact lists: internal/writegate).
var errBusy = &Error{Status: http.StatusServiceUnavailable, Code: "busy",
	Message: "too many writes are waiting for the durable store; nothing was changed, retry after Retry-After"}

// writeError writes err as JSON. Errors that are not *Error are 500s.
func writeError(w http.ResponseWriter, err error) {
	e := classify(err)
	b := make([]byte, 0, 64+len(e.Message))
	b = append(b, `{"error":{"code":`...)
	b = wire.AppendString(b, e.Code)
	b = append(b, `,"message":`...)
	b = wire.AppendString(b, e.Message)
	b = append(b, "}}\n"...)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	if e.Status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(b)
}

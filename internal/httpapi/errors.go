package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
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

func internal(err error) *Error {
	return &Error{Status: http.StatusInternalServerError, Code: "internal", Message: err.Error()}
}

// writeError writes err as JSON. Errors that are not *Error are 500s.
func writeError(w http.ResponseWriter, err error) {
	var e *Error
	if !errors.As(err, &e) {
		e = internal(err)
	}
	b := make([]byte, 0, 64+len(e.Message))
	b = append(b, `{"error":{"code":`...)
	b = appendString(b, e.Code)
	b = append(b, `,"message":`...)
	b = appendString(b, e.Message)
	b = append(b, "}}\n"...)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(e.Status)
	_, _ = w.Write(b)
}

package httpapi

import (
	"fmt"
	"net/http"

	"github.com/presenced/presenced/internal/apierr"
)

// Error is an error with its HTTP status and a stable machine-readable code,
// written as {"error":{"code":"…","message":"…"}} (package apierr decides
// it for every entry point).
type Error = apierr.Error

func badRequest(code, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: code, Message: fmt.Sprintf(format, args...)}
}

func forbidden(msg string) *Error {
	return &Error{Status: http.StatusForbidden, Code: "forbidden", Message: msg}
}

// classify maps an error to what the client is told (apierr.Classify).
func classify(err error) *Error { return apierr.Classify(err) }

// writeError writes err as JSON (apierr.Write).
func writeError(w http.ResponseWriter, err error) { apierr.Write(w, err) }

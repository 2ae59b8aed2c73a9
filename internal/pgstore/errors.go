package pgstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"
)

// unavailableError is an error of the store that says the database cannot
// be reached or cannot serve now, and that the operation changed nothing
// and may be tried again later: the edge answers HTTP 503 `unavailable`
// (tracker.Unavailable finds it through its Unavailable method), so that
// callers need not know pgx.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string     { return e.err.Error() }
func (e *unavailableError) Unwrap() error     { return e.err }
func (e *unavailableError) Unavailable() bool { return true }

// fail wraps err, the error of the operation op, with the package's
// prefix, marked unavailable when it is transient (see transient).
func fail(err error, format string, args ...any) error {
	w := fmt.Errorf("pgstore: "+format+": %w", append(args, err)...)
	if transient(err) {
		return &unavailableError{w}
	}
	return w
}

// transient reports whether err says that PostgreSQL cannot be reached or
// cannot serve for now, rather than that the statement is wrong or the
// data refused it. The operation did not take effect (a transaction that
// fails is rolled back; a statement cut off with its connection is never
// committed by PostgreSQL without the client seeing the commit), so it
// may be retried.
//
// Transient:
//   - a connection that cannot be made, for any reason (refused, reset,
//     DNS, TLS, authentication — pgconn.ConnectError — or the server
//     starting up or shutting down: 57P03), or a pool that cannot hand
//     one out in time (the context's deadline) or is closed (the node is
//     stopping);
//   - a connection lost during the operation: any network error, io.EOF
//     and io.ErrUnexpectedEOF, pgconn.ErrConnClosed, errors pgx marks safe
//     to retry (nothing was sent);
//   - SQLSTATE class 08 (connection exception), 57P01 admin_shutdown,
//     57P02 crash_shutdown, 57P03 cannot_connect_now, 57014
//     query_canceled (statement_timeout, or a cancel during shutdown),
//     class 53 (insufficient resources: too many connections, out of
//     memory, disk full on the server), 40001 serialization_failure and
//     40P01 deadlock_detected (after the store's own retries), 25006
//     read_only_sql_transaction (a write reached a standby during a
//     failover), 55P03 lock_not_available.
//
// Not transient: every other SQLSTATE (a bad statement, a constraint, a
// missing table; class 58, I/O errors of the server, needs its operator),
// a context canceled by the caller (the caller gave up; the edge answers
// that itself), and errors of this package's own rules
// (presence.ErrTooManyContacts).
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return transientCode(pe.Code)
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	switch {
	case errors.As(err, &ce), errors.As(err, &ne),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, puddle.ErrClosedPool),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed),
		pgconn.SafeToRetry(err), pgconn.Timeout(err):
		return true
	}
	return false
}

// transientCode reports whether a SQLSTATE says "not now" (see transient).
func transientCode(code string) bool {
	switch {
	case strings.HasPrefix(code, "08"), // connection_exception and its subclasses
		strings.HasPrefix(code, "53"): // insufficient_resources, disk_full, out_of_memory, too_many_connections, configuration_limit_exceeded
		return true
	}
	switch code {
	case "57P01", // admin_shutdown: the server is stopping (smart or fast shutdown)
		"57P02", // crash_shutdown: another backend crashed, the server restarts
		"57P03", // cannot_connect_now: the server is starting up or in recovery
		"57014", // query_canceled: statement_timeout, or canceled during a shutdown
		"40001", // serialization_failure
		"40P01", // deadlock_detected
		"25006", // read_only_sql_transaction: a standby, during a failover
		"55P03": // lock_not_available
		return true
	}
	return false
}

// retryable reports whether a transaction that failed with err may simply
// be run again at once: PostgreSQL rolled it back because of another
// transaction (a serialization failure or a deadlock), not because it
// cannot serve.
func retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

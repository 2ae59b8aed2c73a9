package tracker

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/presenced/presenced/internal/presence"
)

// ErrUnavailable is returned by Heartbeat, Bye, SetStatus and SetSettings
// while the state store is down and the outage buffer already holds
// Config.MaxBuffered users, and wraps every other error that a store
// outage makes a method return: the operation was not recorded and should
// be retried later (HTTP 503). A SetStatus or SetSettings that fails so has
// already been written to the durable store.
var ErrUnavailable = errors.New("tracker: the presence state store is unavailable and the operation could not be buffered; retry later")

// Unavailable reports whether err says that a backend cannot serve for
// now, rather than that the request or the code is wrong. It is the one
// classification of every edge: such an error is answered HTTP 503
// `unavailable` (with Retry-After) and, over WebSocket, with the error
// `unavailable`; anything else unexpected is 500 `internal`. The operation
// that failed so changed nothing and may be retried later (a SetStatus or
// SetSettings failing after its durable write has that write done). It is
// true for
//
//   - ErrUnavailable (the state store is down and the operation could not
//     be buffered, or it went down during the operation);
//   - an error with a method Unavailable() bool that reports true: the
//     backends mark their own transient errors, so that nobody else needs
//     to know their drivers (pgstore: a connection refused or lost,
//     PostgreSQL starting up or shutting down, too many connections, …;
//     sqlitestore: the file locked by another process);
//   - context.DeadlineExceeded: a backend did not answer in time (the
//     caller's own cancellation, context.Canceled, is not);
//   - a net.Error: a connection of a backend that does not mark its
//     errors failed.
func Unavailable(err error) bool {
	var ne net.Error
	var u interface{ Unavailable() bool }
	return errors.Is(err, ErrUnavailable) || errors.As(err, &u) && u.Unavailable() ||
		errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne)
}

// errOutage marks the errors of store calls that put the store down.
var errOutage = errors.New("tracker: state store unavailable")

// outageError is a store error that marked the store down.
type outageError struct{ err error }

func (e *outageError) Error() string   { return "state store unavailable: " + e.err.Error() }
func (e *outageError) Unwrap() []error { return []error{errOutage, ErrUnavailable, e.err} }

// partial reports a PartialError: part of the store answered.
func partial(err error) bool {
	var pe *PartialError
	return errors.As(err, &pe)
}

// domainError reports the errors of package presence, which say that the
// operation is refused, not that the store is away.
func domainError(err error) bool {
	return errors.Is(err, presence.ErrTooManyDevices) || errors.Is(err, presence.ErrTooManyContacts) ||
		errors.Is(err, presence.ErrUnknownStatus) || errors.Is(err, presence.ErrTooManyRooms) ||
		errors.Is(err, presence.ErrDeviceNotAlive)
}

// errDurableDown is the cause of a load that was not tried because the
// previous one found the durable store unavailable.
var errDurableDown = errors.New("the durable store did not answer a moment ago")

// profileError is a load of a user that failed because the durable store
// is unavailable. It is Unavailable (HTTP 503) for the operations that
// need the profile; a heartbeat or bye waits for it in the cold buffer.
type profileError struct {
	user string
	err  error
}

func (e *profileError) Error() string {
	return fmt.Sprintf("load %q: durable store unavailable: %v", e.user, e.err)
}
func (e *profileError) Unwrap() error     { return e.err }
func (e *profileError) Unavailable() bool { return true }

// profileUnavailable reports whether err is a load that failed for the
// durable store.
func profileUnavailable(err error) bool {
	var pe *profileError
	return errors.As(err, &pe)
}

// errColdFull is returned by Heartbeat and Bye of a user whose profile
// cannot be loaded when Config.MaxBuffered users already wait for theirs.
var errColdFull error = coldFullError{}

type coldFullError struct{}

func (coldFullError) Error() string {
	return "tracker: the durable store is unavailable and too many users wait for their profile; retry later"
}
func (coldFullError) Unavailable() bool { return true }

package sqlitestore

import (
	"errors"
	"fmt"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// unavailableError is an error of the store that says the database file is
// locked by someone else for now (SQLITE_BUSY or SQLITE_LOCKED after the
// busy timeout: a backup tool, another process holding a write lock): the
// operation changed nothing and may be retried later, so the edge answers
// HTTP 503 `unavailable` (tracker.Unavailable finds it through its
// Unavailable method).
type unavailableError struct{ err error }

func (e *unavailableError) Error() string     { return e.err.Error() }
func (e *unavailableError) Unwrap() error     { return e.err }
func (e *unavailableError) Unavailable() bool { return true }

// Kinds of failure of the embedded database (see kind).
const (
	failOther   = iota // a bug, a bad statement: 500, nothing else
	failBusy           // locked by another connection or process: transient, 503
	failStorage        // the file or its disk fails: 500, and the node is not ready
)

// kind classifies an error of the driver by its SQLite result code.
//
// SQLITE_BUSY and SQLITE_LOCKED are transient: another process holds the
// lock longer than the busy timeout, and a retry later may succeed.
//
// SQLITE_FULL (disk or quota full), SQLITE_IOERR (any I/O error),
// SQLITE_READONLY (the file or its directory became read-only),
// SQLITE_CANTOPEN, SQLITE_CORRUPT and SQLITE_NOTADB are failures of this
// node's storage. They are not transient in the sense of "retry in a
// second": an operator has to free space or fix the disk. A client is told
// 500 `internal` (the detail stays in the log), and the store reports the
// failure in Ping — so the node reports itself not ready — until a write
// succeeds again.
func kind(err error) int {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return failOther
	}
	switch se.Code() & 0xff { // the primary result code of an extended one
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return failBusy
	case sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY,
		sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB:
		return failStorage
	}
	return failOther
}

// fail wraps err, the error of an operation, with the package's prefix;
// marks it unavailable if it is transient, and records a storage failure
// for Ping (see kind).
func (s *Store) fail(err error, format string, args ...any) error {
	w := fmt.Errorf("sqlitestore: "+format+": %w", append(args, err)...)
	switch kind(err) {
	case failBusy:
		return &unavailableError{w}
	case failStorage:
		s.fault.Store(&w)
	}
	return w
}

// wrote records that a write succeeded: the storage takes writes again.
// It costs one atomic load while nothing failed.
func (s *Store) wrote() {
	if f := s.fault.Load(); f != nil {
		s.fault.CompareAndSwap(f, nil)
	}
}

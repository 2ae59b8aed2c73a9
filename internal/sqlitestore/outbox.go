package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"math"

	"github.com/presenced/presenced/internal/backendcall"
	"github.com/presenced/presenced/internal/writegate"
)

// The webhook outbox: the changes of presence this node makes, each
// written (group committed, fsynced) before the client that caused it is
// answered, kept until every webhook endpoint is past it (package
// webhook). Entries are numbered by the caller, one after another; each
// endpoint's cursor is the number of the last entry it is done with.

// Backend calls of the outbox, timed into
// presenced_backend_call_duration_seconds.
var (
	callAppendOutbox  = backendcall.New("sqlite", "append_outbox")
	callReadOutbox    = backendcall.New("sqlite", "read_outbox")
	callOutboxState   = backendcall.New("sqlite", "outbox_state")
	callOutboxCursors = backendcall.New("sqlite", "set_outbox_cursors")
)

// AppendOutbox stores entries numbered first, first+1, … in one
// transaction, durable when it returns nil. An entry of a number already
// stored is replaced (a write retried after an error whose commit went
// through after all). It is safe for concurrent use.
func (s *Store) AppendOutbox(ctx context.Context, first uint64, entries [][]byte) (err error) {
	defer callAppendOutbox.Start(ctx).Done(&err)
	if len(entries) == 0 {
		return nil
	}
	if first == 0 || first > math.MaxInt64-uint64(len(entries)) {
		return fmt.Errorf("sqlitestore: append to the outbox: entry number %d out of range", first)
	}
	err = s.write(ctx, writegate.Urgent, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `INSERT OR REPLACE INTO webhook_outbox (seq, data) VALUES (?, ?)`)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for i, e := range entries {
			if _, err := stmt.ExecContext(ctx, int64(first)+int64(i), e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return s.fail(err, "append %d entries to the webhook outbox", len(entries))
	}
	return nil
}

// ReadOutbox calls fn for up to max entries numbered above after, in
// order. fn must not keep data: it is valid only during the call. It is
// safe for concurrent use.
func (s *Store) ReadOutbox(ctx context.Context, after uint64, max int, fn func(seq uint64, data []byte)) (err error) {
	defer callReadOutbox.Start(ctx).Done(&err)
	if after > math.MaxInt64 {
		return fmt.Errorf("sqlitestore: read the outbox: entry number %d out of range", after)
	}
	rows, err := s.r.QueryContext(ctx, `SELECT seq, data FROM webhook_outbox WHERE seq > ? ORDER BY seq LIMIT ?`, int64(after), max)
	if err != nil {
		return s.fail(err, "read the webhook outbox")
	}
	defer rows.Close()
	for rows.Next() {
		var seq int64
		var data sql.RawBytes
		if err := rows.Scan(&seq, &data); err != nil {
			return s.fail(err, "read the webhook outbox")
		}
		fn(uint64(seq), data)
	}
	if err := rows.Err(); err != nil {
		return s.fail(err, "read the webhook outbox")
	}
	return nil
}

// OutboxState returns the highest entry number the outbox holds or any
// cursor names (0 when neither: the next entry is 1), and the cursors.
// It is safe for concurrent use.
func (s *Store) OutboxState(ctx context.Context) (last uint64, cursors map[string]uint64, err error) {
	defer callOutboxState.Start(ctx).Done(&err)
	var top int64
	if err := s.r.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) FROM webhook_outbox`).Scan(&top); err != nil {
		return 0, nil, s.fail(err, "read the webhook outbox")
	}
	last = uint64(top)
	rows, err := s.r.QueryContext(ctx, `SELECT endpoint, seq FROM webhook_cursors`)
	if err != nil {
		return 0, nil, s.fail(err, "read the webhook cursors")
	}
	defer rows.Close()
	cursors = map[string]uint64{}
	for rows.Next() {
		var ep string
		var seq int64
		if err := rows.Scan(&ep, &seq); err != nil {
			return 0, nil, s.fail(err, "read the webhook cursors")
		}
		cursors[ep] = uint64(seq)
		last = max(last, uint64(seq))
	}
	if err := rows.Err(); err != nil {
		return 0, nil, s.fail(err, "read the webhook cursors")
	}
	return last, cursors, nil
}

// SetOutboxCursors replaces the cursors with cursors (endpoint → the
// last entry it is done with) and removes the entries every one of them
// is past, in one transaction. It is safe for concurrent use.
func (s *Store) SetOutboxCursors(ctx context.Context, cursors map[string]uint64) (err error) {
	defer callOutboxCursors.Start(ctx).Done(&err)
	low := uint64(math.MaxInt64)
	for ep, seq := range cursors {
		if seq > math.MaxInt64 {
			return fmt.Errorf("sqlitestore: webhook cursor of %q: entry number %d out of range", ep, seq)
		}
		low = min(low, seq)
	}
	if len(cursors) == 0 {
		low = 0 // no endpoint: nothing is known to be done
	}
	err = s.write(ctx, writegate.Urgent, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM webhook_cursors`); err != nil {
			return err
		}
		for ep, seq := range cursors {
			if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_cursors (endpoint, seq) VALUES (?, ?)`, ep, int64(seq)); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM webhook_outbox WHERE seq <= ?`, int64(low))
		return err
	})
	if err != nil {
		return s.fail(err, "set the webhook cursors")
	}
	return nil
}

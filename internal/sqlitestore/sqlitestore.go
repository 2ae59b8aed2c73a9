// Package sqlitestore is the embedded durable store of presenced: last_seen
// checkpoints, manual statuses, privacy settings and contact lists in one
// SQLite file, through the pure Go driver modernc.org/sqlite (no cgo).
//
// The database runs in WAL mode. All writes go through a single writer
// connection, so writers queue in Go instead of failing with SQLITE_BUSY;
// reads use a separate pool of read-only connections and never wait for a
// writer. last_seen is written in batches, one transaction per batch (group
// commit), never one per heartbeat. Statuses and settings are group
// committed too (internal/groupcommit): the writes that callers make while
// a commit is under way wait in a bounded queue and go together in the
// next transaction, one fsync for all; a lone write is committed at once.
//
// Times are Unix milliseconds. Versions are uint64 in Go and stored in
// SQLite's signed 64-bit INTEGER with the same bit pattern. Versions stay
// below 2^53 (epoch << 32 plus the changes of a run), far below 2^63, so
// the signed comparisons the store makes (MAX) order them correctly; a
// version at or above 2^63 would read back unchanged but compare as
// negative.
//
// Errors are classified by their SQLite result code (errors.go): a file
// locked by another process past the busy timeout is transient (the error
// has a method Unavailable() bool that reports true: HTTP 503); a failing
// storage — disk full, I/O error, read-only — is not, and Ping reports it
// until a write succeeds again, so the node reports itself not ready.
package sqlitestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/presenced/presenced/internal/backendcall"
	"github.com/presenced/presenced/internal/groupcommit"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/writegate"
)

var _ tracker.Durable = (*Store)(nil)

// maxVars is the number of bound variables one statement may use. SQLite
// builds before 3.32 allowed no more than 999 and the limit can be lowered
// at compile time, so the store never relies on more.
const maxVars = 999

// busyTimeoutMS is how long a connection waits for a lock held by another
// connection (a WAL checkpoint, another process) before SQLITE_BUSY.
const busyTimeoutMS = 10000

// Config configures a Store.
type Config struct {
	// Path is the file path of the database, e.g. "data/presenced.db".
	// Required. Its parent directory is created if missing.
	Path string
	// Logger receives the store's few log lines (schema migrations). nil
	// discards them.
	Logger *slog.Logger
	// MaxQueuedContactWrites bounds the contact-list writes waiting for
	// the writer connection; one more fails at once with
	// writegate.ErrBusy. Default 16.
	MaxQueuedContactWrites int
}

// Store is the SQLite durable store. It is safe for concurrent use.
type Store struct {
	log *slog.Logger
	w   *sql.DB // the one writer connection, used only by the holder of gate
	r   *sql.DB // read-only pool
	// gate admits writes to w: statuses, settings and checkpoints before
	// contact lists, whose queue is bounded (internal/writegate).
	gate *writegate.Gate

	// fault is the last failure of the storage (see kind) since the last
	// write that succeeded; nil while writes succeed. Ping reports it.
	fault atomic.Pointer[error]
	// The group commit of statuses and settings (closed by Close), and
	// its statements, prepared once on the writer connection.
	committer                *groupcommit.Committer[profileWrite]
	saveStatus, saveSettings *sql.Stmt

	closeOnce sync.Once
	closeErr  error
}

// migrations are the schema changes in order; migration i takes the
// database from user_version i to i+1. Never edit a released migration:
// append a new one.
var migrations = []string{
	// 1: users and contact lists.
	`CREATE TABLE users (
		user_id              TEXT    PRIMARY KEY,
		manual               INTEGER NOT NULL DEFAULT 0,
		status_text          TEXT    NOT NULL DEFAULT '',
		last_seen            INTEGER NOT NULL DEFAULT 0,
		pub_last_seen        INTEGER NOT NULL DEFAULT 0,
		version              INTEGER NOT NULL DEFAULT 0,
		status_visibility    INTEGER NOT NULL DEFAULT 0,
		last_seen_visibility INTEGER NOT NULL DEFAULT 0
	) WITHOUT ROWID;
	CREATE TABLE contacts (
		user_id    TEXT NOT NULL,
		contact_id TEXT NOT NULL,
		PRIMARY KEY (user_id, contact_id)
	) WITHOUT ROWID;
	CREATE INDEX contacts_by_contact ON contacts (contact_id, user_id);`,
	// 2: the boot counter that versions are stamped above.
	`CREATE TABLE meta (
		key   TEXT    PRIMARY KEY,
		value INTEGER NOT NULL
	) WITHOUT ROWID;
	INSERT INTO meta (key, value) VALUES ('epoch', 0);`,
	// 3: the public face of an invisible user whose text changed since
	// they vanished (presence.Profile.PubText, PubVersion); pub_version 0:
	// the status text and version.
	`ALTER TABLE users ADD COLUMN pub_text TEXT NOT NULL DEFAULT '';
	ALTER TABLE users ADD COLUMN pub_version INTEGER NOT NULL DEFAULT 0;`,
	// 4: the webhook outbox (outbox.go).
	`CREATE TABLE webhook_outbox (
		seq  INTEGER PRIMARY KEY,
		data BLOB    NOT NULL
	);
	CREATE TABLE webhook_cursors (
		endpoint TEXT    PRIMARY KEY,
		seq      INTEGER NOT NULL
	) WITHOUT ROWID;`,
}

// Open opens (creating if needed) the database at cfg.Path and brings its
// schema up to date.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Path == "" {
		return nil, errors.New("sqlitestore: Config.Path is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	path, err := filepath.Abs(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("sqlitestore: create data directory: %w", err)
	}
	// Create the file owner-only before SQLite does (it would use 0644);
	// its -wal and -shm files take the database file's mode.
	if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		return nil, fmt.Errorf("sqlitestore: create %s: %w", path, err)
	} else {
		f.Close()
	}

	// synchronous=FULL: every commit is fsynced before it returns. The
	// tracker records a manual status durably *before* applying it, so that
	// a user who went invisible stays invisible after a crash; with NORMAL a
	// power loss could roll back the last commits and bring such a user
	// back into view. FULL costs one fsync per transaction, and the store
	// commits rarely: last_seen arrives in group-committed batches (one
	// transaction per checkpoint), statuses, settings and contacts change
	// at human speed.
	w, err := sql.Open("sqlite", dsn(path,
		"_txlock=immediate", // take the write lock at BEGIN, never upgrade mid-transaction
		"_pragma=journal_mode(WAL)",
		"_pragma=synchronous(FULL)",
	))
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)

	s := &Store{log: cfg.Logger, w: w, gate: writegate.New(writegate.Config{Slots: 1, MaxQueued: cfg.MaxQueuedContactWrites})}
	// The writer connection sets WAL mode and creates the file, so it goes
	// first; read-only connections cannot do either.
	if err := s.migrate(ctx, path); err != nil {
		w.Close()
		return nil, err
	}
	if err := s.check(ctx, path); err != nil {
		w.Close()
		return nil, err
	}

	r, err := sql.Open("sqlite", dsn(path, "_pragma=query_only(1)"))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	r.SetMaxOpenConns(n)
	r.SetMaxIdleConns(n)
	s.r = r
	if s.saveStatus, err = w.PrepareContext(ctx, saveStatusSQL); err == nil {
		s.saveSettings, err = w.PrepareContext(ctx, saveSettingsSQL)
	}
	if err != nil {
		r.Close()
		w.Close()
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	s.committer = groupcommit.New(groupcommit.Config{}, s.commitWrites)
	if err := r.PingContext(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	return s, nil
}

// dsn returns the driver's data source name for the file at path (absolute)
// with the given query parameters. The path is percent-encoded into a file:
// URI, so no character of it can be taken for a parameter.
func dsn(path string, params ...string) string {
	params = append(params, fmt.Sprintf("_pragma=busy_timeout(%d)", busyTimeoutMS))
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(path), RawQuery: strings.Join(params, "&")}
	return u.String()
}

// migrate applies the migrations the database has not seen, in one
// transaction, and checks it is not newer than this binary.
func (s *Store) migrate(ctx context.Context, path string) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	defer tx.Rollback()
	var have int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&have); err != nil {
		return fmt.Errorf("sqlitestore: read schema version of %s: %w", path, err)
	}
	want := len(migrations)
	switch {
	case have == want:
		return nil
	case have > want:
		return fmt.Errorf("sqlitestore: %s has schema version %d, newer than this binary's %d", path, have, want)
	}
	for v := have; v < want; v++ {
		if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
			return fmt.Errorf("sqlitestore: migrate %s to schema version %d: %w", path, v+1, err)
		}
	}
	// PRAGMA takes no bound parameters; want is this package's own constant.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", want)); err != nil {
		return fmt.Errorf("sqlitestore: set schema version of %s: %w", path, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: migrate %s: %w", path, err)
	}
	s.log.Info("durable store schema migrated", "path", path, "from", have, "to", want)
	return nil
}

// check runs SQLite's quick integrity check (every page and record
// readable and well formed; not the contents of indexes): a node refuses to
// start on a damaged file rather than fail every read and write later.
func (s *Store) check(ctx context.Context, path string) error {
	start := time.Now()
	rows, err := s.w.QueryContext(ctx, "PRAGMA quick_check(5)")
	if err != nil {
		return damaged(path, err.Error())
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return damaged(path, err.Error())
		}
		if line != "ok" {
			problems = append(problems, line)
		}
	}
	if err := rows.Err(); err != nil {
		return damaged(path, err.Error())
	}
	if len(problems) > 0 {
		return damaged(path, strings.Join(problems, "; "))
	}
	s.log.Info("durable store checked", "path", path, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

func damaged(path, what string) error {
	return fmt.Errorf("sqlitestore: %s is damaged (%s): restore it from a backup, or move it and its -wal file away to start empty "+
		"(last_seen, manual statuses, settings and contact lists would be lost)", path, what)
}

// Close commits the status and settings writes already queued and closes
// the database. Writes after it fail. It is
// idempotent and safe for concurrent use; every call returns the result of
// the first.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.committer.Close()
		s.saveStatus.Close()
		s.saveSettings.Close()
		var errR error
		if s.r != nil {
			errR = s.r.Close()
		}
		// The writer closes last: the last connection to close checkpoints
		// the WAL into the database file.
		s.closeErr = errors.Join(errR, s.w.Close())
	})
	return s.closeErr
}

// Ping reports whether the database can be read and written: it reads the
// file through both connections and, after a write failed for the storage
// (disk full, I/O error, read-only: see kind) and none succeeded since,
// commits a write of a page (put and removed in one transaction) to check
// that the storage takes writes again. It is safe for concurrent use.
func (s *Store) Ping(ctx context.Context) (err error) {
	defer callPing.Start(ctx).Done(&err)
	var epoch int64
	if err := s.r.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'epoch'`).Scan(&epoch); err != nil {
		return s.fail(err, "ping")
	}
	if err := s.gate.Enter(ctx, writegate.Urgent); err != nil {
		return s.fail(err, "ping")
	}
	err = s.w.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'epoch'`).Scan(&epoch)
	s.gate.Leave()
	if err != nil {
		return s.fail(err, "ping")
	}
	if f := s.fault.Load(); f != nil {
		// A write that needs a page more and a commit, undone within the
		// same transaction: the file keeps its content.
		err := s.write(ctx, writegate.Urgent, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('ping', zeroblob(8192))`); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `DELETE FROM meta WHERE key = 'ping'`)
			return err
		})
		if err != nil {
			return s.fail(err, "ping: the storage still refuses writes")
		}
	}
	return nil
}

// loadProfilesQuery selects the records of n users by primary key.
func loadProfilesQuery(n int) string {
	return `SELECT user_id, manual, status_text, last_seen, pub_last_seen, version,
		status_visibility, last_seen_visibility, pub_text, pub_version FROM users WHERE user_id IN ` + placeholders(n)
}

const contactsQuery = `SELECT contact_id FROM contacts WHERE user_id = ? ORDER BY contact_id`

// LoadProfiles calls fn once for each distinct id of ids that has a durable
// record, in no particular order; unknown ids are skipped. It runs one
// query per 999 ids. fn runs while the query does and must not keep the
// pointer it is given. It is safe for concurrent use.
func (s *Store) LoadProfiles(ctx context.Context, ids []string, fn func(*presence.Profile)) (err error) {
	defer callLoadProfiles.Start(ctx).Done(&err)
	var p presence.Profile
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), maxVars)]
		ids = ids[len(chunk):]
		if err := s.loadProfiles(ctx, chunk, &p, fn); err != nil {
			return s.fail(err, "load profiles")
		}
	}
	return nil
}

func (s *Store) loadProfiles(ctx context.Context, ids []string, p *presence.Profile, fn func(*presence.Profile)) error {
	rows, err := s.r.QueryContext(ctx, loadProfilesQuery(len(ids)), stringArgs(nil, ids)...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var manual, version, statusVis, lastSeenVis, pubVersion int64
		if err := rows.Scan(&p.UserID, &manual, &p.Text, &p.LastSeen, &p.PubLastSeen, &version,
			&statusVis, &lastSeenVis, &p.PubText, &pubVersion); err != nil {
			return err
		}
		p.Manual = presence.Manual(manual)
		p.Version = uint64(version) // bit pattern, see the package doc
		p.PubVersion = uint64(pubVersion)
		p.Settings = presence.Settings{
			Status:   presence.Visibility(statusVis),
			LastSeen: presence.Visibility(lastSeenVis),
		}
		fn(p)
	}
	return rows.Err()
}

// SaveStatus records a user's manual status and status text, creating the
// user's record if needed, and in the same statement the public face that
// goes with them (presence.Profile.SaveStatus: kept for a status
// invisible, the text's for any other); nothing else of the record
// changes. It returns
// once the write is durable, group committed with the other status and
// settings writes of the moment (see the package doc), or with its own
// error. Writes are committed in the order they are queued, so of two calls
// of which one returned before the other began, the later one wins.
//
// If ctx ends while the write waits for its group, the write is dropped and
// ctx's error returned; if it ends while the group is being committed,
// ctx's error is returned and the write may be durable nonetheless, as with
// any database. It is safe for concurrent use.
func (s *Store) SaveStatus(ctx context.Context, user string, m presence.Manual, text string) (err error) {
	defer callSaveStatus.Start(ctx).Done(&err)
	if err := s.committer.Write(ctx, profileWrite{user: user, manual: m, text: text}); err != nil {
		return s.fail(err, "save status of %q", user)
	}
	s.wrote()
	return nil
}

// SaveSettings records a user's privacy settings, creating the user's record
// if needed; nothing else of the record changes. It is group committed as
// SaveStatus is, with the same promises. It is safe for concurrent use.
func (s *Store) SaveSettings(ctx context.Context, user string, st presence.Settings) (err error) {
	defer callSaveSettings.Start(ctx).Done(&err)
	if err := s.committer.Write(ctx, profileWrite{user: user, settings: true, st: st}); err != nil {
		return s.fail(err, "save settings of %q", user)
	}
	s.wrote()
	return nil
}

// profileWrite is a status or a settings write waiting for its group
// commit.
type profileWrite struct {
	user     string
	settings bool // a settings write (st), else a status write (manual, text)
	manual   presence.Manual
	text     string
	st       presence.Settings
}

const (
	// saveStatusSQL is presence.Profile.SaveStatus: the record's face
	// kept (at version 1 at least) for a status invisible (3), none for
	// any other. Its last argument is 1 for a status invisible, else 0:
	// a new record's version and face version.
	saveStatusSQL = `INSERT INTO users (user_id, manual, status_text, version, pub_version) VALUES (?1, ?2, ?3, ?4, ?4)
		ON CONFLICT (user_id) DO UPDATE SET
			pub_text    = CASE WHEN excluded.manual <> 3 THEN '' WHEN pub_version = 0 THEN status_text ELSE pub_text END,
			pub_version = CASE WHEN excluded.manual <> 3 THEN 0 WHEN pub_version = 0 THEN MAX(version, 1) ELSE pub_version END,
			version     = CASE WHEN excluded.manual = 3 THEN MAX(version, 1) ELSE version END,
			manual = excluded.manual, status_text = excluded.status_text`
	saveSettingsSQL = `INSERT INTO users (user_id, status_visibility, last_seen_visibility) VALUES (?, ?, ?)
		ON CONFLICT (user_id) DO UPDATE SET status_visibility = excluded.status_visibility,
			last_seen_visibility = excluded.last_seen_visibility`
)

// faceVersion is the version and face version of a record that a status
// m creates (saveStatusSQL): 1 for invisible, whose face is kept, else 0.
func faceVersion(m presence.Manual) int64 {
	if m == presence.ManualInvisible {
		return 1
	}
	return 0
}

// commitWrites is the group commit: the writes, in order, in one
// transaction.
func (s *Store) commitWrites(ctx context.Context, group []profileWrite) (err error) {
	defer callCommitWrites.Start(ctx).Done(&err)
	if len(group) == 1 {
		if err := s.gate.Enter(ctx, writegate.Urgent); err != nil {
			return err
		}
		defer s.gate.Leave()
		// A lone write is its own transaction: no BEGIN and COMMIT of
		// ours around it.
		w := &group[0]
		var err error
		if w.settings {
			_, err = s.saveSettings.ExecContext(ctx, w.user, int64(w.st.Status), int64(w.st.LastSeen))
		} else {
			_, err = s.saveStatus.ExecContext(ctx, w.user, int64(w.manual), w.text, faceVersion(w.manual))
		}
		return err
	}
	return s.write(ctx, writegate.Urgent, func(tx *sql.Tx) error {
		// The statements are prepared on the writer connection, the one
		// the transaction runs on: Stmt reuses them.
		status := tx.StmtContext(ctx, s.saveStatus)
		defer status.Close()
		settings := tx.StmtContext(ctx, s.saveSettings)
		defer settings.Close()
		for i := range group {
			w := &group[i]
			var err error
			if w.settings {
				_, err = settings.ExecContext(ctx, w.user, int64(w.st.Status), int64(w.st.LastSeen))
			} else {
				_, err = status.ExecContext(ctx, w.user, int64(w.manual), w.text, faceVersion(w.manual))
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// lastSeenRows is how many profiles one statement of SaveLastSeen writes:
// 6 variables each, within maxVars. Fewer, bigger statements cut the
// per-statement overhead of database/sql and the driver.
const lastSeenRows = maxVars / 6

// upsertLastSeen returns the statement that writes n profiles' last_seen,
// pub_last_seen and version, each only forwards, so a replayed or reordered
// batch changes nothing it should not, and the public face (pub_text,
// pub_version) that goes with the newest version — but a face of none
// leaves an invisible user's (presence.Profile.Checkpoint). A new record
// gets the defaults for everything else; an unchanged one is not
// rewritten. A user
// named twice in one statement is upserted twice, in order, which MAX
// makes harmless.
func upsertLastSeen(n int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO users (user_id, last_seen, pub_last_seen, version, pub_text, pub_version) VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,?)")
	}
	b.WriteString(` ON CONFLICT (user_id) DO UPDATE SET
		last_seen     = MAX(last_seen, excluded.last_seen),
		pub_last_seen = MAX(pub_last_seen, excluded.pub_last_seen),
		version       = MAX(version, excluded.version),
		pub_text      = CASE WHEN excluded.version >= version AND (excluded.pub_version <> 0 OR manual <> 3) THEN excluded.pub_text ELSE pub_text END,
		pub_version   = CASE WHEN excluded.version >= version AND (excluded.pub_version <> 0 OR manual <> 3) THEN excluded.pub_version ELSE pub_version END
	WHERE excluded.last_seen > last_seen
		OR excluded.pub_last_seen > pub_last_seen
		OR excluded.version > version`)
	return b.String()
}

var (
	upsertLastSeenFull = upsertLastSeen(lastSeenRows)
	upsertLastSeenOne  = upsertLastSeen(1)
)

// face returns the pub_text and pub_version columns of p: "" and 0 when
// its public face is its own text and version (presence.Profile.Frozen).
func face(p *presence.Profile) (text string, version int64) {
	if !p.Frozen() {
		return "", 0
	}
	text, v := p.Public()
	return text, int64(v)
}

// SaveLastSeen writes the LastSeen, PubLastSeen and Version of every profile
// of batch in one transaction (group commit), and its public face (PubText,
// PubVersion; Text only to tell whether it is frozen) with the newest
// version; the other fields are ignored. None of the three ever moves
// backwards, so a batch may be replayed, arrive out of order or name a
// user twice. It is safe for concurrent use.
func (s *Store) SaveLastSeen(ctx context.Context, batch []presence.Profile) (err error) {
	defer callSaveLastSeen.Start(ctx).Done(&err)
	if len(batch) == 0 {
		return nil
	}
	err = s.write(ctx, writegate.Urgent, func(tx *sql.Tx) error {
		args := make([]any, 0, 6*min(len(batch), lastSeenRows))
		rest := batch
		if len(rest) >= lastSeenRows {
			stmt, err := tx.PrepareContext(ctx, upsertLastSeenFull)
			if err != nil {
				return err
			}
			defer stmt.Close()
			for len(rest) >= lastSeenRows {
				args = args[:0]
				for i := range lastSeenRows {
					p := &rest[i]
					pt, pv := face(p)
					args = append(args, p.UserID, p.LastSeen, p.PubLastSeen, int64(p.Version), pt, pv)
				}
				if _, err := stmt.ExecContext(ctx, args...); err != nil {
					return err
				}
				rest = rest[lastSeenRows:]
			}
		}
		if len(rest) == 0 {
			return nil
		}
		stmt, err := tx.PrepareContext(ctx, upsertLastSeenOne)
		if err != nil {
			return err
		}
		defer stmt.Close()
		for i := range rest {
			p := &rest[i]
			pt, pv := face(p)
			if _, err := stmt.ExecContext(ctx, p.UserID, p.LastSeen, p.PubLastSeen, int64(p.Version), pt, pv); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return s.fail(err, "save last_seen of %d users", len(batch))
	}
	return nil
}

// NextEpoch durably counts one more run of the node and returns its
// number (1 for the first). Versions stamped in this run start above it.
// It is safe for concurrent use.
func (s *Store) NextEpoch(ctx context.Context) (_ uint64, err error) {
	defer callNextEpoch.Start(ctx).Done(&err)
	var epoch int64
	err = s.write(ctx, writegate.Urgent, func(tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, `UPDATE meta SET value = value + 1 WHERE key = 'epoch' RETURNING value`).Scan(&epoch)
	})
	if err != nil {
		return 0, s.fail(err, "next epoch")
	}
	return uint64(epoch), nil
}

// checkContactCount fails with presence.ErrTooManyContacts, rolling the
// transaction back, when user's list has grown past presence.MaxContacts.
func checkContactCount(ctx context.Context, tx *sql.Tx, user string) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM contacts WHERE user_id = ?`, user).Scan(&n); err != nil {
		return err
	}
	if n > presence.MaxContacts {
		return fmt.Errorf("%w (the change would make %d)", presence.ErrTooManyContacts, n)
	}
	return nil
}

// SetContacts replaces the contact list of user — the users user lets see
// them when a visibility is Contacts — with contacts, atomically.
// Duplicates are ignored. Only what changes is written: contacts no
// longer listed are deleted, new ones inserted, the others left alone. It
// is safe for concurrent use.
func (s *Store) SetContacts(ctx context.Context, user string, contacts []string) (err error) {
	defer callSetContacts.Start(ctx).Done(&err)
	list, err := jsonList(contacts)
	if err != nil {
		return fmt.Errorf("sqlitestore: set contacts of %q: %w", user, err)
	}
	err = s.write(ctx, writegate.Bulk, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM contacts WHERE user_id = ?1
			AND contact_id NOT IN (SELECT value FROM json_each(?2))`, user, list); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, insertContacts, user, list); err != nil {
			return err
		}
		return checkContactCount(ctx, tx, user)
	})
	if err != nil {
		return s.fail(err, "set contacts of %q", user)
	}
	return nil
}

// insertContacts inserts the contacts of a JSON array (?2) into the list
// of user ?1 in one statement; listed ones are left alone.
const insertContacts = `INSERT OR IGNORE INTO contacts (user_id, contact_id)
	SELECT ?1, value FROM json_each(?2)`

// jsonList encodes ids, sorted and without duplicates, as a JSON array:
// the one variable a statement of a whole list binds (json_each), so
// there is no statement per entry and no limit on the variables of one
// statement. In order, the rows of a list are written where the last one
// went (both indexes are in contact order within a user).
func jsonList(ids []string) (string, error) {
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	if ids == nil {
		ids = []string{}
	}
	b, err := json.Marshal(ids)
	return string(b), err
}

// AddContacts adds contacts to the contact list of user, in one
// transaction. Contacts already listed are left alone. It is safe for
// concurrent use.
func (s *Store) AddContacts(ctx context.Context, user string, contacts []string) (err error) {
	defer callAddContacts.Start(ctx).Done(&err)
	if len(contacts) == 0 {
		return nil
	}
	list, err := jsonList(contacts)
	if err != nil {
		return fmt.Errorf("sqlitestore: add contacts of %q: %w", user, err)
	}
	err = s.write(ctx, writegate.Bulk, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, insertContacts, user, list); err != nil {
			return err
		}
		return checkContactCount(ctx, tx, user)
	})
	if err != nil {
		return s.fail(err, "add contacts of %q", user)
	}
	return nil
}

// RemoveContacts removes contacts from the contact list of user, in one
// transaction. Contacts not listed are ignored. It is safe for concurrent
// use.
func (s *Store) RemoveContacts(ctx context.Context, user string, contacts []string) (err error) {
	defer callRemoveContacts.Start(ctx).Done(&err)
	if len(contacts) == 0 {
		return nil
	}
	list, err := jsonList(contacts)
	if err != nil {
		return fmt.Errorf("sqlitestore: remove contacts of %q: %w", user, err)
	}
	err = s.write(ctx, writegate.Bulk, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM contacts WHERE user_id = ?1
			AND contact_id IN (SELECT value FROM json_each(?2))`, user, list)
		return err
	})
	if err != nil {
		return s.fail(err, "remove contacts of %q", user)
	}
	return nil
}

// Contacts returns the contact list of user in ascending byte order; the
// list of a user without one is empty, not an error. It is safe for
// concurrent use.
func (s *Store) Contacts(ctx context.Context, user string) (_ []string, err error) {
	defer callContacts.Start(ctx).Done(&err)
	rows, err := s.r.QueryContext(ctx, contactsQuery, user)
	if err != nil {
		return nil, s.fail(err, "contacts of %q", user)
	}
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, s.fail(err, "contacts of %q", user)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(err, "contacts of %q", user)
	}
	return out, nil
}

// ListedBy calls fn for each owner of owners whose contact list contains
// viewer, in no particular order: these are the owners whose
// Contacts-visible presence viewer may see. An owner named more than once
// in owners may be reported more than once. It runs one query per 998
// owners. fn runs while the query does. It is safe for concurrent use.
func (s *Store) ListedBy(ctx context.Context, viewer string, owners []string, fn func(owner string)) (err error) {
	defer callListedBy.Start(ctx).Done(&err)
	args := make([]any, 0, min(len(owners), maxVars-1)+1)
	for len(owners) > 0 {
		chunk := owners[:min(len(owners), maxVars-1)] // one variable is the viewer
		owners = owners[len(chunk):]
		args = stringArgs(append(args[:0], viewer), chunk)
		if err := s.listedBy(ctx, len(chunk), args, fn); err != nil {
			return s.fail(err, "owners listing %q", viewer)
		}
	}
	return nil
}

// listedByQuery selects which of n owners list a contact; the
// (contact_id, user_id) index serves it.
func listedByQuery(n int) string {
	return `SELECT user_id FROM contacts WHERE contact_id = ? AND user_id IN ` + placeholders(n)
}

func (s *Store) listedBy(ctx context.Context, n int, args []any, fn func(string)) error {
	rows, err := s.r.QueryContext(ctx, listedByQuery(n), args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var owner string
		if err := rows.Scan(&owner); err != nil {
			return err
		}
		fn(owner)
	}
	return rows.Err()
}

// write runs fn in a transaction on the writer connection (BEGIN
// IMMEDIATE) and commits it, or rolls it back if fn fails. It first waits
// for the gate as a write of kind k (a bulk write may get
// writegate.ErrBusy). A commit clears a recorded storage failure.
func (s *Store) write(ctx context.Context, k writegate.Kind, fn func(*sql.Tx) error) error {
	if err := s.gate.Enter(ctx, k); err != nil {
		return err
	}
	defer s.gate.Leave()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.wrote()
	return nil
}

// placeholders returns "(?, ?, …)" with n variables. It carries no values.
func placeholders(n int) string {
	var b strings.Builder
	b.Grow(3*n + 1)
	b.WriteByte('(')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('?')
	}
	b.WriteByte(')')
	return b.String()
}

// stringArgs appends ss to args as query arguments.
func stringArgs(args []any, ss []string) []any {
	if args == nil {
		args = make([]any, 0, len(ss))
	}
	for _, s := range ss {
		args = append(args, s)
	}
	return args
}

// Backend calls timed into presenced_backend_call_duration_seconds.
var (
	callPing           = backendcall.New("sqlite", "ping")
	callLoadProfiles   = backendcall.New("sqlite", "load_profiles")
	callSaveStatus     = backendcall.New("sqlite", "save_status")
	callSaveSettings   = backendcall.New("sqlite", "save_settings")
	callCommitWrites   = backendcall.New("sqlite", "commit_writes")
	callSaveLastSeen   = backendcall.New("sqlite", "save_last_seen")
	callNextEpoch      = backendcall.New("sqlite", "next_epoch")
	callSetContacts    = backendcall.New("sqlite", "set_contacts")
	callAddContacts    = backendcall.New("sqlite", "add_contacts")
	callRemoveContacts = backendcall.New("sqlite", "remove_contacts")
	callContacts       = backendcall.New("sqlite", "contacts")
	callListedBy       = backendcall.New("sqlite", "listed_by")
)

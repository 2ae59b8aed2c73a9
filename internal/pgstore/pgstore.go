// Package pgstore is the PostgreSQL durable store of presenced, for
// scale-out: last_seen checkpoints, manual statuses, privacy settings and
// contact lists, shared by every node, through pgx's connection pool.
//
// It keeps the promises of the embedded store (internal/sqlitestore) and
// runs the same conformance suite (internal/durabletest). Every method is
// one round trip where it can be: a checkpoint of any size is one unnest
// upsert, a bulk read one query with = ANY(array). Statuses and settings
// are group committed (internal/groupcommit) and contact-list writes
// admitted through a writegate.Gate.
//
// The store expects a database (or a schema, chosen with search_path in the
// URL) of its own: it creates the tables users, contacts, contact_lists,
// meta and schema_version, migrating under an advisory lock. Every error
// that says PostgreSQL cannot serve for now (errors.go) has a method
// Unavailable() bool that reports true: the operation changed nothing and
// may be retried (tracker.Unavailable, HTTP 503); callers need not know
// pgx. How ids, times and versions are stored, and why, is in
// docs/internals.md ("Durability").
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/presenced/presenced/internal/backendcall"
	"github.com/presenced/presenced/internal/groupcommit"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/writegate"
)

var _ tracker.Durable = (*Store)(nil)

// migrationLock is the key of the session-wide PostgreSQL advisory lock
// (the one-bigint key space) held while the schema is checked and
// migrated, so that nodes starting at once migrate one after the other.
// It is the first 8 bytes of "presence" read as a big-endian integer.
const migrationLock int64 = 0x70726573656e6365

// Config configures a Store.
type Config struct {
	// URL is the PostgreSQL connection string, a URL
	// ("postgres://user:pass@host:5432/presenced?sslmode=disable") or a
	// keyword/value string. Required. pool_max_conns in it is overridden by
	// MaxConns when that is set.
	URL string
	// Logger receives the store's few log lines (schema migrations). nil
	// discards them.
	Logger *slog.Logger
	// MaxConns is the most connections of the store's shared pool. 0
	// takes the URL's pool_max_conns, or pgxpool's default (the larger of
	// 4 and the number of CPUs). The group commit of statuses and
	// settings has one connection more, of its own.
	MaxConns int
	// MaxQueuedContactWrites bounds the contact-list writes waiting for a
	// connection of their own; one more fails at once with
	// writegate.ErrBusy. Default 16. Contact-list writes hold at most
	// half the pool's connections at once, so the rest is always there
	// for statuses, settings, checkpoints and reads.
	MaxQueuedContactWrites int
}

// Store is the PostgreSQL durable store. It is safe for concurrent use.
type Store struct {
	log  *slog.Logger
	pool *pgxpool.Pool
	// commits is the group commit's own connection (a pool of one). The
	// statuses and settings that callers wait for never queue for a
	// connection of pool behind reads: a reconnect storm's thousands of
	// subscriptions each read contact relations at once (ListedBy), and a
	// pool's queue is first come, first served.
	commits   *pgxpool.Pool
	committer *groupcommit.Committer[profileWrite] // statuses and settings; closed by Close
	// lists admits contact-list writes: half the pool's connections at
	// most, a bounded queue (internal/writegate).
	lists *writegate.Gate

	closeOnce sync.Once
}

// migrations are the schema changes in order; migration i takes the
// database from schema version i to i+1. Never edit a released migration:
// append a new one.
var migrations = []string{
	// 1: users, contact lists, the boot counter.
	//
	// users is updated in place by every checkpoint and none of the
	// columns a checkpoint writes is indexed, so with free room in each
	// page (fillfactor) the updates are HOT: no index is touched.
	//
	// contact_lists holds a row per owner who ever had a list; a change of
	// the list locks it, so the contact limit is enforced even for
	// concurrent additions, without creating a profile in users.
	`CREATE TABLE users (
		user_id              text COLLATE "C" PRIMARY KEY,
		manual               smallint NOT NULL DEFAULT 0,
		status_text          text     NOT NULL DEFAULT '',
		last_seen            bigint   NOT NULL DEFAULT 0,
		pub_last_seen        bigint   NOT NULL DEFAULT 0,
		version              bigint   NOT NULL DEFAULT 0,
		status_visibility    smallint NOT NULL DEFAULT 0,
		last_seen_visibility smallint NOT NULL DEFAULT 0
	) WITH (fillfactor = 80);
	CREATE TABLE contact_lists (
		user_id text COLLATE "C" PRIMARY KEY
	);
	CREATE TABLE contacts (
		user_id    text COLLATE "C" NOT NULL,
		contact_id text COLLATE "C" NOT NULL,
		PRIMARY KEY (user_id, contact_id)
	);
	CREATE INDEX contacts_by_contact ON contacts (contact_id, user_id);
	CREATE TABLE meta (
		key   text   PRIMARY KEY,
		value bigint NOT NULL
	);
	INSERT INTO meta (key, value) VALUES ('epoch', 0);`,
	// 2: the public face of an invisible user whose text changed since
	// they vanished (presence.Profile.PubText, PubVersion); pub_version 0:
	// the status text and version.
	`ALTER TABLE users ADD COLUMN pub_text text NOT NULL DEFAULT '',
		ADD COLUMN pub_version bigint NOT NULL DEFAULT 0;`,
}

// Open connects to the database at cfg.URL and brings its schema up to
// date. Several nodes may open the same database at once.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.URL == "" {
		return nil, errors.New("pgstore: Config.URL is required")
	}
	if cfg.MaxConns < 0 {
		return nil, fmt.Errorf("pgstore: Config.MaxConns is %d, want 0 (default) or more", cfg.MaxConns)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	pc, err := pgxpool.ParseConfig(cfg.URL)
	if err != nil {
		// The error of ParseConfig may quote the URL with its password.
		return nil, errors.New("pgstore: Config.URL is not a valid PostgreSQL connection string")
	}
	if cfg.MaxConns > 0 {
		pc.MaxConns = int32(min(cfg.MaxConns, 1<<30))
	}
	cc := pc.Copy()
	cc.MaxConns, cc.MinConns, cc.MinIdleConns = 1, 0, 0
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fail(err, "open")
	}
	commits, err := pgxpool.NewWithConfig(ctx, cc)
	if err != nil {
		pool.Close()
		return nil, fail(err, "open")
	}
	s := &Store{log: cfg.Logger, pool: pool, commits: commits, lists: writegate.New(writegate.Config{
		Slots:     max(1, int(pc.MaxConns)/2),
		MaxQueued: cfg.MaxQueuedContactWrites,
	})}
	if err := s.migrate(ctx); err != nil {
		commits.Close()
		pool.Close()
		return nil, err
	}
	s.committer = groupcommit.New(groupcommit.Config{}, s.commitWrites)
	return s, nil
}

// migrate applies the migrations the database has not seen, in one
// transaction, under the advisory lock, and checks that the database is
// not newer than this binary.
func (s *Store) migrate(ctx context.Context) error {
	var have, want int
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Transaction-scoped: released by the commit or the rollback,
		// even if the connection breaks.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLock); err != nil {
			return fmt.Errorf("take the migration lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
			one     boolean PRIMARY KEY DEFAULT true CHECK (one),
			version integer NOT NULL
		)`); err != nil {
			return fmt.Errorf("create schema_version: %w", err)
		}
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_version`).Scan(&have); err != nil {
			return fmt.Errorf("read schema version: %w", err)
		}
		want = len(migrations)
		switch {
		case have == want:
			return nil
		case have > want:
			return fmt.Errorf("the database has schema version %d, newer than this binary's %d", have, want)
		}
		for v := have; v < want; v++ {
			if _, err := tx.Exec(ctx, migrations[v]); err != nil {
				return fmt.Errorf("migrate to schema version %d: %w", v+1, err)
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO schema_version (version) VALUES ($1)
			ON CONFLICT (one) DO UPDATE SET version = excluded.version`, want)
		return err
	})
	if err != nil {
		return fail(err, "open")
	}
	if have != want {
		s.log.Info("durable store schema migrated", "from", have, "to", want)
	}
	return nil
}

// Close commits the status and settings writes already queued, then
// closes every connection of the store, waiting for the ones in use to be
// released. It is idempotent and safe for concurrent use.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.committer.Close()
		s.commits.Close()
		s.pool.Close()
	})
	return nil
}

// Ping reports whether the database answers. It is safe for concurrent
// use.
func (s *Store) Ping(ctx context.Context) (err error) {
	defer callPing.Start(ctx).Done(&err)
	if err := s.pool.Ping(ctx); err != nil {
		return fail(err, "ping")
	}
	return nil
}

const loadProfilesQuery = `SELECT user_id, manual, status_text, last_seen, pub_last_seen, version,
	status_visibility, last_seen_visibility, pub_text, pub_version FROM users WHERE user_id = ANY($1)`

// LoadProfiles calls fn once for each distinct id of ids that has a durable
// record, in no particular order; unknown ids are skipped. It runs one
// query, whatever the number of ids. fn runs while the query does and must
// not keep the pointer it is given. It is safe for concurrent use.
func (s *Store) LoadProfiles(ctx context.Context, ids []string, fn func(*presence.Profile)) (err error) {
	defer callLoadProfiles.Start(ctx).Done(&err)
	if len(ids) == 0 {
		return nil
	}
	rows, err := s.pool.Query(ctx, loadProfilesQuery, ids)
	if err != nil {
		return fail(err, "load profiles")
	}
	defer rows.Close()
	var p presence.Profile
	for rows.Next() {
		var manual, statusVis, lastSeenVis int16
		var version, pubVersion int64
		if err := rows.Scan(&p.UserID, &manual, &p.Text, &p.LastSeen, &p.PubLastSeen, &version,
			&statusVis, &lastSeenVis, &p.PubText, &pubVersion); err != nil {
			return fail(err, "load profiles")
		}
		p.Manual = presence.Manual(manual)
		p.Version = uint64(version) // bit pattern, see the package doc
		p.PubVersion = uint64(pubVersion)
		p.Settings = presence.Settings{
			Status:   presence.Visibility(statusVis),
			LastSeen: presence.Visibility(lastSeenVis),
		}
		fn(&p)
	}
	if err := rows.Err(); err != nil {
		return fail(err, "load profiles")
	}
	return nil
}

// SaveStatus records a user's manual status and status text, creating the
// user's record if needed, and in the same statement the public face that
// goes with them (presence.Profile.SaveStatus: kept for a status
// invisible, the text's for any other); nothing else of the record
// changes. It returns
// once the write is committed, group committed with the other status and
// settings writes of the moment on this node (internal/groupcommit: one
// statement, one round trip and one WAL flush for all of them), or with
// its own error. Of two calls of which one returned before the other
// began, the later one wins.
//
// If ctx ends while the write waits for its group, the write is dropped and
// ctx's error returned; if it ends while the group is being committed,
// ctx's error is returned and the write may be committed nonetheless, as
// with any database. It is safe for concurrent use.
func (s *Store) SaveStatus(ctx context.Context, user string, m presence.Manual, text string) (err error) {
	defer callSaveStatus.Start(ctx).Done(&err)
	if err := s.committer.Write(ctx, profileWrite{user: user, manual: m, text: text}); err != nil {
		return fail(err, "save status of %q", user)
	}
	return nil
}

// SaveSettings records a user's privacy settings, creating the user's record
// if needed; nothing else of the record changes. It is group committed as
// SaveStatus is, with the same promises. It is safe for concurrent use.
func (s *Store) SaveSettings(ctx context.Context, user string, st presence.Settings) (err error) {
	defer callSaveSettings.Start(ctx).Done(&err)
	if err := s.committer.Write(ctx, profileWrite{user: user, settings: true, st: st}); err != nil {
		return fail(err, "save settings of %q", user)
	}
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

// statusFace is how a status write sets the public face of an existing
// record u with the status excluded (presence.Profile.SaveStatus): kept
// (at version 1 at least) for a status invisible (3), none for any other.
// A new record's version and face version are 1 for invisible, else 0.
const statusFace = `pub_text = CASE WHEN excluded.manual <> 3 THEN '' WHEN u.pub_version = 0 THEN u.status_text ELSE u.pub_text END,
		pub_version = CASE WHEN excluded.manual <> 3 THEN 0 WHEN u.pub_version = 0 THEN GREATEST(u.version, 1) ELSE u.pub_version END,
		version = CASE WHEN excluded.manual = 3 THEN GREATEST(u.version, 1) ELSE u.version END,
		manual = excluded.manual, status_text = excluded.status_text`

// saveStatus and saveSettings write one user's status or settings.
const (
	saveStatus = `INSERT INTO users AS u (user_id, manual, status_text, version, pub_version)
		VALUES ($1, $2::smallint, $3, CASE WHEN $2::smallint = 3 THEN 1 ELSE 0 END, CASE WHEN $2::smallint = 3 THEN 1 ELSE 0 END)
		ON CONFLICT (user_id) DO UPDATE SET ` + statusFace
	saveSettings = `INSERT INTO users (user_id, status_visibility, last_seen_visibility) VALUES ($1, $2, $3)
		ON CONFLICT (user_id) DO UPDATE SET status_visibility = excluded.status_visibility,
			last_seen_visibility = excluded.last_seen_visibility`
)

// upsertStatuses and upsertSettings write the statuses or settings of the
// users in parallel arrays (sorted by id, each id once), locking the rows
// in the order of the arrays, as upsertLastSeen does.
const (
	upsertStatuses = `INSERT INTO users AS u (user_id, manual, status_text, version, pub_version)
	SELECT id, m, t, CASE WHEN m = 3 THEN 1 ELSE 0 END, CASE WHEN m = 3 THEN 1 ELSE 0 END
	FROM unnest($1::text[], $2::smallint[], $3::text[]) AS s(id, m, t)
	ON CONFLICT (user_id) DO UPDATE SET ` + statusFace
	upsertSettings = `INSERT INTO users AS u (user_id, status_visibility, last_seen_visibility)
	SELECT * FROM unnest($1::text[], $2::smallint[], $3::smallint[])
	ON CONFLICT (user_id) DO UPDATE SET status_visibility = excluded.status_visibility,
		last_seen_visibility = excluded.last_seen_visibility`
)

// commitWrites is the group commit: the group's statuses in one upsert and
// its settings in another, in one round trip and one (implicit)
// transaction. An upsert may touch a row only once, so of a user's writes
// of one kind only the group's last is sent: the others would have been
// overwritten within the same transaction anyway. (Only the public face
// may differ: a status invisible after another status of the same group
// keeps the face of before the group rather than the text of that other
// status — either one everyone was shown; the next checkpoint writes the
// face that is.)
func (s *Store) commitWrites(ctx context.Context, group []profileWrite) (err error) {
	defer callCommitWrites.Start(ctx).Done(&err)
	if len(group) == 1 {
		// A lone write: the plain one-row statement.
		w := &group[0]
		var err error
		if w.settings {
			_, err = s.commits.Exec(ctx, saveSettings, w.user, int16(w.st.Status), int16(w.st.LastSeen))
		} else {
			_, err = s.commits.Exec(ctx, saveStatus, w.user, int16(w.manual), w.text)
		}
		return err
	}
	var st, se []int // indexes into group: the last write of each user, per kind
	last := make(map[string]int, len(group))
	for _, settings := range []bool{false, true} {
		clear(last)
		for i := range group {
			if group[i].settings == settings {
				last[group[i].user] = i
			}
		}
		idx := make([]int, 0, len(last))
		for _, i := range last {
			idx = append(idx, i)
		}
		// Byte order of the ids (COLLATE "C"), as every upsert of the store
		// locks rows: concurrent commits of several nodes cannot deadlock.
		slices.SortFunc(idx, func(a, b int) int { return strings.Compare(group[a].user, group[b].user) })
		if settings {
			se = idx
		} else {
			st = idx
		}
	}
	b := &pgx.Batch{}
	if len(st) > 0 {
		ids, manual, text := make([]string, len(st)), make([]int16, len(st)), make([]string, len(st))
		for j, i := range st {
			ids[j], manual[j], text[j] = group[i].user, int16(group[i].manual), group[i].text
		}
		b.Queue(upsertStatuses, ids, manual, text)
	}
	if len(se) > 0 {
		ids, sv, lv := make([]string, len(se)), make([]int16, len(se)), make([]int16, len(se))
		for j, i := range se {
			ids[j], sv[j], lv[j] = group[i].user, int16(group[i].st.Status), int16(group[i].st.LastSeen)
		}
		b.Queue(upsertSettings, ids, sv, lv)
	}
	return s.commits.SendBatch(ctx, b).Close()
}

// upsertLastSeen writes the last_seen, pub_last_seen and version of the
// users in parallel arrays (sorted by id, each id once), each only
// forwards, so a replayed or reordered batch changes nothing it should
// not, and the public face (pub_text, pub_version) that goes with the
// newest version — but a face of none leaves an invisible user's
// (presence.Profile.Checkpoint). A new record gets the defaults for
// everything else; an unchanged one is not rewritten.
//
// The rows are inserted, and so locked, in the order of the arrays: a
// function scan of unnest returns them in order. Two checkpoints that lock
// the same users in the same (byte) order cannot deadlock.
const upsertLastSeen = `INSERT INTO users AS u (user_id, last_seen, pub_last_seen, version, pub_text, pub_version)
	SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[], $6::bigint[])
	ON CONFLICT (user_id) DO UPDATE SET
		last_seen     = GREATEST(u.last_seen, excluded.last_seen),
		pub_last_seen = GREATEST(u.pub_last_seen, excluded.pub_last_seen),
		version       = GREATEST(u.version, excluded.version),
		pub_text      = CASE WHEN excluded.version >= u.version AND (excluded.pub_version <> 0 OR u.manual <> 3)
			THEN excluded.pub_text ELSE u.pub_text END,
		pub_version   = CASE WHEN excluded.version >= u.version AND (excluded.pub_version <> 0 OR u.manual <> 3)
			THEN excluded.pub_version ELSE u.pub_version END
	WHERE excluded.last_seen > u.last_seen
		OR excluded.pub_last_seen > u.pub_last_seen
		OR excluded.version > u.version`

// lastSeenBatch is a checkpoint as upsertLastSeen takes it.
type lastSeenBatch struct {
	ids         []string
	lastSeen    []int64
	pubLastSeen []int64
	versions    []int64
	pubTexts    []string // the public face: "" and 0 when not frozen
	pubVersions []int64
	order       []int32 // indexes into the caller's batch, sorted by id
}

// columns fills b from batch: sorted by user id in byte order (the order
// of COLLATE "C"), each user once with the largest of each of its values.
// batch is not modified.
func (b *lastSeenBatch) columns(batch []presence.Profile) {
	b.order = b.order[:0]
	for i := range batch {
		b.order = append(b.order, int32(i))
	}
	slices.SortFunc(b.order, func(x, y int32) int { return strings.Compare(batch[x].UserID, batch[y].UserID) })
	b.ids, b.lastSeen, b.pubLastSeen, b.versions = b.ids[:0], b.lastSeen[:0], b.pubLastSeen[:0], b.versions[:0]
	b.pubTexts, b.pubVersions = b.pubTexts[:0], b.pubVersions[:0]
	for _, i := range b.order {
		p := &batch[i]
		pt, pv := "", int64(0)
		if p.Frozen() {
			var v uint64
			pt, v = p.Public()
			pv = int64(v)
		}
		if n := len(b.ids); n > 0 && b.ids[n-1] == p.UserID {
			// An upsert may not touch a row twice: merge, column by
			// column, as the database would (signed, like GREATEST).
			if int64(p.Version) >= b.versions[n-1] {
				b.pubTexts[n-1], b.pubVersions[n-1] = pt, pv
			}
			b.lastSeen[n-1] = max(b.lastSeen[n-1], p.LastSeen)
			b.pubLastSeen[n-1] = max(b.pubLastSeen[n-1], p.PubLastSeen)
			b.versions[n-1] = max(b.versions[n-1], int64(p.Version))
			continue
		}
		b.ids = append(b.ids, p.UserID)
		b.lastSeen = append(b.lastSeen, p.LastSeen)
		b.pubLastSeen = append(b.pubLastSeen, p.PubLastSeen)
		b.versions = append(b.versions, int64(p.Version)) // bit pattern
		b.pubTexts = append(b.pubTexts, pt)
		b.pubVersions = append(b.pubVersions, pv)
	}
}

var lastSeenPool = sync.Pool{New: func() any { return new(lastSeenBatch) }}

// SaveLastSeen writes the LastSeen, PubLastSeen and Version of every profile
// of batch in one statement (group commit), and its public face (PubText,
// PubVersion where presence.Profile.Frozen) with the newest version; the
// other fields are ignored.
// None of the three ever moves backwards, so a batch may be replayed, arrive
// out of order or name a user twice. Concurrent calls with overlapping
// batches do not deadlock: each locks its rows in byte order of the ids. It
// is safe for concurrent use.
func (s *Store) SaveLastSeen(ctx context.Context, batch []presence.Profile) (err error) {
	defer callSaveLastSeen.Start(ctx).Done(&err)
	if len(batch) == 0 {
		return nil
	}
	b := lastSeenPool.Get().(*lastSeenBatch)
	defer lastSeenPool.Put(b)
	b.columns(batch)
	if _, err := s.pool.Exec(ctx, upsertLastSeen,
		textArray(b.ids), int8Array(b.lastSeen), int8Array(b.pubLastSeen), int8Array(b.versions),
		textArray(b.pubTexts), int8Array(b.pubVersions)); err != nil {
		return fail(err, "save last_seen of %d users", len(batch))
	}
	return nil
}

// NextEpoch durably counts one more run of a node and returns its number
// (1 for the first). Versions stamped in this run start above it. Nodes
// sharing the database share the counter, so no two runs of any nodes get
// the same epoch. It is safe for concurrent use.
func (s *Store) NextEpoch(ctx context.Context) (_ uint64, err error) {
	defer callNextEpoch.Start(ctx).Done(&err)
	var epoch int64
	err = s.pool.QueryRow(ctx, `UPDATE meta SET value = value + 1 WHERE key = 'epoch' RETURNING value`).Scan(&epoch)
	if err != nil {
		return 0, fail(err, "next epoch")
	}
	return uint64(epoch), nil
}

// txRetries is how many times a transaction is run when PostgreSQL rolls
// it back for a serialization failure or a deadlock with another one.
const txRetries = 3

// tx runs fn in a transaction and commits it, running it again (at most
// txRetries times in all) when PostgreSQL rolled it back because of
// another transaction. fn must have no effect outside the transaction.
func (s *Store) tx(ctx context.Context, fn func(pgx.Tx) error) error {
	var err error
	for range txRetries {
		if err = pgx.BeginFunc(ctx, s.pool, fn); !retryable(err) {
			return err
		}
	}
	return err
}

// listTx runs fn as tx does, once the gate of contact-list writes let it
// in (writegate.ErrBusy if its queue is full).
func (s *Store) listTx(ctx context.Context, fn func(pgx.Tx) error) error {
	if err := s.lists.Enter(ctx, writegate.Bulk); err != nil {
		return err
	}
	defer s.lists.Leave()
	return s.tx(ctx, fn)
}

// lockContactList takes the row lock on user's contact list for the rest of
// the transaction, creating the list's row if needed. Changes of one list
// run one after the other; the count they check cannot change under them.
func lockContactList(ctx context.Context, tx pgx.Tx, user string) error {
	_, err := tx.Exec(ctx, `INSERT INTO contact_lists (user_id) VALUES ($1)
		ON CONFLICT (user_id) DO UPDATE SET user_id = excluded.user_id`, user)
	return err
}

const addContacts = `INSERT INTO contacts (user_id, contact_id)
	SELECT $1, c FROM unnest($2::text[]) AS c
	ON CONFLICT DO NOTHING`

// checkContactCount fails with presence.ErrTooManyContacts, rolling the
// transaction back, when user's list has grown past presence.MaxContacts.
func checkContactCount(ctx context.Context, tx pgx.Tx, user string) error {
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM contacts WHERE user_id = $1`, user).Scan(&n); err != nil {
		return err
	}
	if n > presence.MaxContacts {
		return fmt.Errorf("%w (the change would make %d)", presence.ErrTooManyContacts, n)
	}
	return nil
}

// SetContacts replaces the contact list of user — the users user lets see
// them when a visibility is Contacts — with contacts, atomically.
// Duplicates are ignored. It is safe for concurrent use.
func (s *Store) SetContacts(ctx context.Context, user string, contacts []string) (err error) {
	defer callSetContacts.Start(ctx).Done(&err)
	err = s.listTx(ctx, func(tx pgx.Tx) error {
		if err := lockContactList(ctx, tx, user); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM contacts WHERE user_id = $1 AND contact_id NOT IN (SELECT unnest($2::text[]))`, user, contacts); err != nil {
			return err
		}
		if len(contacts) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, addContacts, user, contacts); err != nil {
			return err
		}
		return checkContactCount(ctx, tx, user)
	})
	if err != nil {
		return fail(err, "set contacts of %q", user)
	}
	return nil
}

// AddContacts adds contacts to the contact list of user, in one
// transaction. Contacts already listed are left alone. It is safe for
// concurrent use.
func (s *Store) AddContacts(ctx context.Context, user string, contacts []string) (err error) {
	defer callAddContacts.Start(ctx).Done(&err)
	if len(contacts) == 0 {
		return nil
	}
	err = s.listTx(ctx, func(tx pgx.Tx) error {
		if err := lockContactList(ctx, tx, user); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, addContacts, user, contacts); err != nil {
			return err
		}
		return checkContactCount(ctx, tx, user)
	})
	if err != nil {
		return fail(err, "add contacts of %q", user)
	}
	return nil
}

// RemoveContacts removes contacts from the contact list of user, in one
// statement. Contacts not listed are ignored. It is safe for concurrent
// use.
func (s *Store) RemoveContacts(ctx context.Context, user string, contacts []string) (err error) {
	defer callRemoveContacts.Start(ctx).Done(&err)
	if len(contacts) == 0 {
		return nil
	}
	err = s.lists.Enter(ctx, writegate.Bulk)
	if err == nil {
		_, err = s.pool.Exec(ctx, `DELETE FROM contacts WHERE user_id = $1 AND contact_id = ANY($2)`, user, contacts)
		s.lists.Leave()
	}
	if err != nil {
		return fail(err, "remove contacts of %q", user)
	}
	return nil
}

const contactsQuery = `SELECT contact_id FROM contacts WHERE user_id = $1 ORDER BY contact_id COLLATE "C"`

// Contacts returns the contact list of user in ascending byte order; the
// list of a user without one is empty, not an error. It is safe for
// concurrent use.
func (s *Store) Contacts(ctx context.Context, user string) (_ []string, err error) {
	defer callContacts.Start(ctx).Done(&err)
	rows, err := s.pool.Query(ctx, contactsQuery, user)
	if err != nil {
		return nil, fail(err, "contacts of %q", user)
	}
	out, err := pgx.AppendRows(make([]string, 0), rows, pgx.RowTo[string])
	if err != nil {
		return nil, fail(err, "contacts of %q", user)
	}
	return out, nil
}

// listedByQuery selects which owners list a contact; the
// (contact_id, user_id) index serves it.
const listedByQuery = `SELECT user_id FROM contacts WHERE contact_id = $1 AND user_id = ANY($2)`

// ListedBy calls fn for each owner of owners whose contact list contains
// viewer, in no particular order and each once: these are the owners whose
// Contacts-visible presence viewer may see. It runs one query, whatever the
// number of owners. fn runs while the query does. It is safe for concurrent
// use.
func (s *Store) ListedBy(ctx context.Context, viewer string, owners []string, fn func(owner string)) (err error) {
	defer callListedBy.Start(ctx).Done(&err)
	if len(owners) == 0 {
		return nil
	}
	rows, err := s.pool.Query(ctx, listedByQuery, viewer, owners)
	if err != nil {
		return fail(err, "owners listing %q", viewer)
	}
	defer rows.Close()
	for rows.Next() {
		var owner string
		if err := rows.Scan(&owner); err != nil {
			return fail(err, "owners listing %q", viewer)
		}
		fn(owner)
	}
	if err := rows.Err(); err != nil {
		return fail(err, "owners listing %q", viewer)
	}
	return nil
}

// Backend calls timed into presenced_backend_call_duration_seconds.
var (
	callPing           = backendcall.New("postgres", "ping")
	callLoadProfiles   = backendcall.New("postgres", "load_profiles")
	callSaveStatus     = backendcall.New("postgres", "save_status")
	callSaveSettings   = backendcall.New("postgres", "save_settings")
	callCommitWrites   = backendcall.New("postgres", "commit_writes")
	callSaveLastSeen   = backendcall.New("postgres", "save_last_seen")
	callNextEpoch      = backendcall.New("postgres", "next_epoch")
	callSetContacts    = backendcall.New("postgres", "set_contacts")
	callAddContacts    = backendcall.New("postgres", "add_contacts")
	callRemoveContacts = backendcall.New("postgres", "remove_contacts")
	callContacts       = backendcall.New("postgres", "contacts")
	callListedBy       = backendcall.New("postgres", "listed_by")
)

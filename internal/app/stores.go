package app

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/httpapi"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/pgstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/replica"
	"github.com/presenced/presenced/internal/sqlitestore"
	"github.com/presenced/presenced/internal/tracker"
)

// openDurable opens PostgreSQL when configured, else the embedded SQLite
// file, and takes this run's epoch from it: versions of this run start
// above every earlier run's.
func (a *App) openDurable(ctx context.Context) error {
	var (
		d     durableStore
		err   error
		check httpapi.Check
	)
	if a.cfg.PostgresURL != "" {
		d, err = pgstore.Open(ctx, pgstore.Config{URL: a.cfg.PostgresURL, Logger: a.cfg.Logger.With("component", "postgres")})
		check = httpapi.Check{Name: "postgres", Shared: true}
	} else {
		d, err = sqlitestore.Open(ctx, sqlitestore.Config{
			Path:   filepath.Join(a.cfg.DataDir, "presenced.db"),
			Logger: a.cfg.Logger.With("component", "sqlite"),
		})
		check = httpapi.Check{Name: "sqlite"} // this node's own
	}
	if err != nil {
		return fmt.Errorf("open durable store: %w", err)
	}
	a.durable, check.Check = d, d.Ping
	a.add(part{close: d.Close, check: check})
	a.rules.Epoch, err = d.NextEpoch(ctx)
	return err
}

// openState opens the hot state: Redis when configured, else memory.
func (a *App) openState(ctx context.Context) error {
	if a.cfg.RedisURL == "" {
		ms := memstore.New(memstore.Config{Rules: a.rules, RoomRules: presence.RoomRules{MaxRooms: a.cfg.MaxRooms}})
		a.store, a.stats.Users = ms, ms.Len
		return nil
	}
	var err error
	if a.redis, err = redisstore.Dial(a.cfg.RedisURL); err != nil {
		return err
	}
	a.add(part{close: noErr(a.redis.Close), check: httpapi.Check{Name: "redis", Shared: true, Check: a.redisReady}})
	// Versions of this run start above every earlier run's, also for
	// users loaded into Redis (see redisstore's package doc).
	rs, err := redisstore.Open(ctx, a.redis, redisstore.Config{Rules: a.rules, Prefix: a.cfg.RedisPrefix, Buckets: a.cfg.RedisBuckets,
		RoomRules: presence.RoomRules{MaxRooms: a.cfg.MaxRooms}})
	if err != nil {
		return err
	}
	a.store, a.stats.SharedState = rs, true
	return nil
}

// errStoreDown is the readiness check of Redis failing.
var errStoreDown = errors.New("the state store is down: writes are buffered in the node")

// redisReady is the readiness check of Redis: the tracker does not
// buffer its writes.
func (a *App) redisReady(context.Context) error {
	if a.tracker.StoreDown() {
		return errStoreDown
	}
	return nil
}

// openReplica builds, with Redis and NATS, the read replica of users'
// public statuses: with ReadReplica every user's, filled from Redis;
// else at most ReadReplicaUsers, read from Redis on a miss (none if it is
// negative). Either is kept by this node's changes and, from the bus,
// everyone else's (replicaFresh says when it may answer).
func (a *App) openReplica(context.Context) error {
	if a.cfg.RedisURL == "" || a.cfg.NATSURL == "" || (!a.cfg.ReadReplica && a.cfg.ReadReplicaUsers < 0) {
		return nil
	}
	src, ok := a.store.(replica.Source)
	if !ok {
		return errors.New("a read replica needs Redis")
	}
	limit := a.cfg.ReadReplicaUsers
	if a.cfg.ReadReplica {
		limit = 0
	}
	var err error
	a.replica, err = replica.New(replica.Config{Source: src, Fresh: a.replicaFresh, Max: limit,
		ReadTimeout: tracker.DefaultStoreTimeout, // as the tracker's calls of the store
		Logger:      a.cfg.Logger.With("component", "replica")})
	if err != nil {
		return err
	}
	a.stats.Replica = a.replica.Stats
	a.add(part{run: quiet(a.replica.Run), stop: stopBus, publish: a.replica})
	if ns, ok := a.store.(deviceNotes); ok {
		a.add(part{run: a.hearNotes(ns), stop: stopBus})
	}
	return nil
}

// deviceNotes is the store as the replica's full views need it
// (redisstore.Store.Notes).
type deviceNotes interface {
	Notes(ctx context.Context, retry time.Duration, note func(user string), up func(bool)) error
}

// hearNotes runs the store's device notes into the replica, which
// answers full views while it hears them. Where the store has none (a
// Redis before 7.0), full views are read from the store.
func (a *App) hearNotes(ns deviceNotes) func(context.Context) error {
	log := a.cfg.Logger.With("component", "replica")
	return func(ctx context.Context) error {
		var heard atomic.Bool
		err := ns.Notes(ctx, 250*time.Millisecond, a.replica.NoteDevices, func(up bool) {
			if heard.Swap(up) != up {
				if up {
					log.Info("device notes heard: full views are answered by the read replica")
				} else {
					log.Warn("device notes lost: full views are read from Redis until they are heard again")
				}
			}
			a.replica.NotesUp(up)
		})
		if errors.Is(err, redisstore.ErrNoNotes) {
			log.Info("no device notes on this Redis (before 7.0): full views are read from Redis", "err", err)
		}
		return nil
	}
}

// fullViews is the replica as the reader's Views.
type fullViews struct{ r *replica.Replica }

func (v fullViews) Get(ctx context.Context, now int64, ids []string, out []presence.Snapshot) error {
	return v.r.GetFull(ctx, now, ids, out)
}

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// notesChannel is the channel of shard sk's device notes (helpers.lua's
// save): <tag>devs, in the shard's slot.
func (sk *shardKeys) notesChannel() string { return sk.tag + "devs" }

// ErrNoNotes is returned by Notes on a Redis that refuses SSUBSCRIBE
// (before 7.0): no device notes are heard there.
var ErrNoNotes = errors.New("redisstore: no device notes on this Redis")

// errNotesMoved ends a subscription whose channels Redis moved to another
// node (a Cluster's slots migrated or failed over).
var errNotesMoved = errors.New("a notes channel moved")

// Notes hears the store's device notes until ctx is done: note is called
// with the id of each user whose devices changed while nothing everyone
// sees of them did (a second device came, one of several went), in the
// order of each shard's changes, from one goroutine per Redis node (it
// must be safe for concurrent use). up(true) is called once every
// shard's channel is subscribed — on a Cluster, on a dedicated connection
// to each master that serves some — and up(false) when one is lost or a
// channel moves (notes may be missed until up(true) again: it subscribes
// again every retry). On a Redis that refuses the subscription it returns
// ErrNoNotes as soon as it does.
func (s *Store) Notes(ctx context.Context, retry time.Duration, note func(user string), up func(bool)) error {
	channels := make([]string, len(s.shards))
	for k := range s.shards {
		channels[k] = s.shards[k].notesChannel()
	}
	for {
		err := s.hearAll(ctx, channels, note, func() { up(true) }) // a lost connection: subscribed again after retry
		up(false)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if re, ok := rueidis.IsRedisErr(err); ok && strings.Contains(strings.ToLower(re.Error()), "unknown command") {
			return fmt.Errorf("%w: %v", ErrNoNotes, err) // before 7.0; anything else may pass
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(retry):
		}
	}
}

// notesGroup is the channels one Redis node serves, and its client.
type notesGroup struct {
	c        rueidis.Client
	channels []string
}

// notesGroups groups channels by the node that serves them: all of them
// on one Redis; on a Cluster, by the master of each one's slot, as
// CLUSTER SLOTS says now.
func (s *Store) notesGroups(ctx context.Context, channels []string) ([]notesGroup, error) {
	if s.c.Mode() != rueidis.ClientModeCluster {
		return []notesGroup{{c: s.c, channels: channels}}, nil
	}
	ranges, err := s.c.Do(ctx, s.c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, fmt.Errorf("cluster slots: %w", err)
	}
	type span struct {
		lo, hi int64
		addr   string
	}
	var spans []span
	for _, r := range ranges {
		f, err := r.ToArray()
		if err != nil || len(f) < 3 {
			return nil, fmt.Errorf("cluster slots: an entry of %d fields (%v)", len(f), err)
		}
		lo, err1 := f[0].AsInt64()
		hi, err2 := f[1].AsInt64()
		node, err3 := f[2].ToArray()
		if err := errors.Join(err1, err2, err3); err != nil || len(node) < 2 {
			return nil, fmt.Errorf("cluster slots: %v", err)
		}
		host, err1 := node[0].ToString()
		port, err2 := node[1].AsInt64()
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("cluster slots: %w", err)
		}
		spans = append(spans, span{lo, hi, fmt.Sprintf("%s:%d", host, port)})
	}
	nodes := s.c.Nodes()
	byAddr := map[string]int{}
	var groups []notesGroup
	for _, ch := range channels {
		cmd := s.c.B().Spublish().Channel(ch).Message("").Build()
		slot := int64(cmd.Slot())
		addr := ""
		for _, sp := range spans {
			if slot >= sp.lo && slot <= sp.hi {
				addr = sp.addr
			}
		}
		c, ok := nodes[addr]
		if !ok {
			return nil, fmt.Errorf("the master of %s (slot %d, %q) is not among the client's nodes", ch, slot, addr)
		}
		i, ok := byAddr[addr]
		if !ok {
			i = len(groups)
			byAddr[addr] = i
			groups = append(groups, notesGroup{c: c})
		}
		groups[i].channels = append(groups[i].channels, ch)
	}
	return groups, nil
}

// hearAll subscribes every group on a dedicated connection of its own,
// calls subscribed once all are, and hears them until one of them or ctx
// ends.
func (s *Store) hearAll(ctx context.Context, channels []string, note func(string), subscribed func()) error {
	groups, err := s.notesGroups(ctx, channels)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var pending atomic.Int64
	pending.Store(int64(len(groups)))
	errc := make(chan error, len(groups))
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			errc <- hearNotes(ctx, g, note, func() {
				if pending.Add(-1) == 0 {
					subscribed()
				}
			})
		})
	}
	err = <-errc
	cancel()
	wg.Wait()
	return err
}

// hearNotes subscribes one dedicated connection to g's channels (one
// SSUBSCRIBE each: a Cluster node refuses one across slots) and hears
// them until it, a channel's slot, or ctx ends.
func hearNotes(ctx context.Context, g notesGroup, note func(string), subscribed func()) error {
	dc, release := g.c.Dedicate()
	defer func() {
		dc.Close() // never back to the pool: it is (or was) subscribed
		release()
	}()
	var n atomic.Int64
	moved := make(chan struct{}, 1)
	wait := dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage: func(m rueidis.PubSubMessage) { note(m.Message) },
		OnSubscription: func(sub rueidis.PubSubSubscription) {
			switch sub.Kind {
			case "ssubscribe":
				if n.Add(1) == int64(len(g.channels)) {
					subscribed()
				}
			case "sunsubscribe": // its slot moved
				select {
				case moved <- struct{}{}:
				default:
				}
			}
		},
	})
	cmds := make(rueidis.Commands, len(g.channels))
	for i, ch := range g.channels {
		cmds[i] = dc.B().Ssubscribe().Channel(ch).Build()
	}
	for _, r := range dc.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	// A connection that died without a word (a cut link) says nothing:
	// a PING a second finds it within notesProbe.
	probe := time.NewTicker(notesProbe / 2)
	defer probe.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-wait:
			return err
		case <-moved:
			return errNotesMoved
		case <-probe.C:
			pctx, cancel := context.WithTimeout(ctx, notesProbe/2)
			err := dc.Do(pctx, dc.B().Ping().Build()).Error()
			cancel()
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("probe: %w", err)
			}
		}
	}
}

// notesProbe bounds how long a dead notes connection goes unnoticed.
const notesProbe = 2 * time.Second

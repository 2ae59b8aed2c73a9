package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// notesChannel is the channel of shard sk's device notes (helpers.lua's
// save): <tag>devs, in the shard's slot.
func (sk *shardKeys) notesChannel() string { return sk.tag + "devs" }

// ErrNoNotes is returned by Notes where no notes can be heard: on a
// Redis Cluster (the shards' channels live on several masters, and one
// connection hears one), and on a Redis that refuses SSUBSCRIBE (before
// 7.0).
var ErrNoNotes = errors.New("redisstore: no device notes on this Redis")

// Notes hears the store's device notes until ctx is done: note is called
// with the id of each user whose devices changed while nothing everyone
// sees of them did (a second device came, one of several went), from one
// goroutine, in the order of each shard's changes. up(true) is called
// once every shard's channel is subscribed, up(false) when the
// connection is lost (notes may be missed until up(true) again: it
// subscribes again every retry). On a Redis Cluster it returns
// ErrNoNotes at once, and on a Redis that refuses the subscription as
// soon as it does.
func (s *Store) Notes(ctx context.Context, retry time.Duration, note func(user string), up func(bool)) error {
	if s.c.Mode() == rueidis.ClientModeCluster {
		return ErrNoNotes
	}
	channels := make([]string, len(s.shards))
	for k := range s.shards {
		channels[k] = s.shards[k].notesChannel()
	}
	for {
		err := s.hearNotes(ctx, channels, note, up) // a lost connection: subscribed again after retry
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

// hearNotes subscribes one dedicated connection to channels and hears
// them until it or ctx ends.
func (s *Store) hearNotes(ctx context.Context, channels []string, note func(string), up func(bool)) error {
	dc, release := s.c.Dedicate()
	defer func() {
		dc.Close() // never back to the pool: it is (or was) subscribed
		release()
	}()
	subscribed := 0
	wait := dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage: func(m rueidis.PubSubMessage) { note(m.Message) },
		OnSubscription: func(sub rueidis.PubSubSubscription) {
			if sub.Kind == "ssubscribe" {
				if subscribed++; subscribed == len(channels) {
					up(true)
				}
			}
		},
	})
	if err := dc.Do(ctx, dc.B().Ssubscribe().Channel(channels...).Build()).Error(); err != nil {
		return err
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

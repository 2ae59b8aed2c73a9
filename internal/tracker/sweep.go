package tracker

import (
	"context"
	"fmt"
	"sync"

	"github.com/presenced/presenced/internal/presence"
)

// sweeper applies the deadlines due in the store and publishes the
// changes.
type sweeper struct {
	link   *link
	events *emitter
	batch  int // Config.SweepBatch: changes a store call applies at most

	mu  sync.Mutex // guards buf
	buf []presence.Change
}

// sweep applies every deadline due now and publishes the changes. It
// returns how many changes it published. It does nothing while the store
// is down and for RecoverGrace after it came back, nor for a part in the
// same case (docs/internals.md, "Outages of the state store").
func (s *sweeper) sweep(ctx context.Context) (int, error) {
	if !s.link.sweepable() {
		return 0, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	total := 0
	skip := s.link.sweepSkip()
	ps := s.link.can.partSweeper
	if skip != nil && ps == nil {
		return 0, nil // a part is down or just back: no sweep until it is settled
	}
	for {
		b := s.link.bound(ctx)
		var out []presence.Change
		var err error
		if skip != nil {
			out, err = ps.ExpireParts(b.ctx, s.link.now(), s.batch, skip, s.buf[:0])
		} else {
			out, err = s.link.store.Expire(b.ctx, s.link.now(), s.batch, s.buf[:0])
		}
		s.link.release(b)
		s.link.partsFailed(err)
		err = s.link.check(ctx, err)
		for i := range out {
			s.events.emit(&out[i])
		}
		total += len(out)
		clear(out)
		s.buf = out[:0]
		if err != nil {
			return total, fmt.Errorf("sweep: %w", err)
		}
		if len(out) < s.batch {
			return total, nil
		}
	}
}

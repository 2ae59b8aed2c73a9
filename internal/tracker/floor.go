package tracker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// floors keep the version floor of a store that may lose its data (a
// Floorer: Redis). Versions never repeat or go back: when the store lost
// its data, a new epoch from the durable store (an EpochCounter) becomes
// its floor, above every version published before.
type floors struct {
	link    *link
	floorer Floorer      // nil: the store cannot be helped (reset returns ErrStoreReset)
	epochs  EpochCounter // nil: the epoch of this run
	epoch   uint64       // this run's epoch (presence.Rules.Epoch)
	// unclaim, if not nil, has the devices this node holds claimed again
	// (they are gone with the store's data).
	unclaim func(now int64)

	mu     sync.Mutex    // serialises reset
	resets atomic.Uint64 // times the store was found to have lost its data
}

// reset answers a store that lost its data (ErrStoreReset): it takes a
// new epoch from the durable store — above every epoch any node ran in,
// so above every version published before — and raises the store's
// floor to it. Concurrent callers raise it once: the others find the
// floor back and return. A store without Floorer cannot be helped:
// ErrStoreReset is returned.
func (f *floors) reset(ctx context.Context) error {
	if f.floorer == nil {
		return ErrStoreReset
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	b := f.link.bound(ctx)
	have, err := f.floorer.CheckFloor(b.ctx)
	f.link.release(b)
	// A part that does not answer (PartialError) keeps its floor for all
	// we know; the others' answer stands.
	if err = f.link.check(ctx, err); err != nil && !partial(err) {
		return err
	}
	if have {
		return nil // raised by another caller meanwhile
	}
	epoch := f.epoch
	if f.epochs != nil {
		if epoch, err = f.epochs.NextEpoch(ctx); err != nil {
			return fmt.Errorf("state store lost its data; a new epoch for its versions: %w", err)
		}
	}
	b = f.link.bound(ctx)
	err = f.floorer.RaiseFloor(b.ctx, epoch<<32)
	f.link.release(b)
	if err = f.link.check(ctx, err); err != nil && !partial(err) {
		return err
	}
	f.resets.Add(1)
	f.link.log.Warn("the state store lost its data: versions continue from a new epoch", "epoch", epoch)
	if f.unclaim != nil {
		f.unclaim(f.link.now()) // the devices this node holds are claimed again
	}
	return nil
}

// check asks the store whether it still has its floor and, when it lost
// it — Redis restarted empty, perhaps between two calls, so no call
// failed — raises it. It reports whether it did: the application should
// then resync its watchers (OnRecover), since what they show may have
// been lost with the data. Run calls it every FlushInterval while the
// store is up.
func (f *floors) check(ctx context.Context) bool {
	if f.floorer == nil || !f.link.up() {
		return false
	}
	b := f.link.bound(ctx)
	have, err := f.floorer.CheckFloor(b.ctx)
	f.link.release(b)
	f.link.partsFailed(err) // a node that only checks floors learns of a part down so too
	if err = f.link.check(ctx, err); err != nil && !partial(err) || have {
		return false
	}
	if err := f.reset(ctx); err != nil {
		if ctx.Err() == nil && !errors.Is(err, errOutage) {
			f.link.log.Warn("raising the version floor of a state store that lost its data failed; will retry", "err", err)
		}
		return false
	}
	return true
}

// restore raises the floor of a store that came back from an outage if
// it lost it (nothing without Floorer), before any replayed user is
// loaded or read.
func (f *floors) restore(ctx context.Context) error {
	if f.floorer == nil {
		return nil
	}
	return f.reset(ctx)
}

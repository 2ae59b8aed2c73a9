package tracker

import (
	"context"
	"errors"
	"fmt"
)

// resetFloor answers a store that lost its data (ErrStoreReset): it takes
// a new epoch from the durable store (EpochCounter) — above every epoch
// any node ran in, so above every version published before — and raises
// the store's floor to it (Floorer). Concurrent callers raise it once: the
// others find the floor back and return. A store without Floorer cannot
// be helped: ErrStoreReset is returned.
func (t *Tracker) resetFloor(ctx context.Context) error {
	f := t.link.can.floorer
	if f == nil {
		return ErrStoreReset
	}
	t.floorMu.Lock()
	defer t.floorMu.Unlock()
	b := t.link.bound(ctx)
	have, err := f.CheckFloor(b.ctx)
	t.link.release(b)
	// A part that does not answer (PartialError) keeps its floor for all
	// we know; the others' answer stands.
	if err = t.link.check(ctx, err); err != nil && !partial(err) {
		return err
	}
	if have {
		return nil // raised by another caller meanwhile
	}
	epoch := t.rules.Epoch
	if ec, ok := t.durable.(EpochCounter); ok {
		if epoch, err = ec.NextEpoch(ctx); err != nil {
			return fmt.Errorf("state store lost its data; a new epoch for its versions: %w", err)
		}
	}
	b = t.link.bound(ctx)
	err = f.RaiseFloor(b.ctx, epoch<<32)
	t.link.release(b)
	if err = t.link.check(ctx, err); err != nil && !partial(err) {
		return err
	}
	t.resets.Add(1)
	t.log.Warn("the state store lost its data: versions continue from a new epoch", "epoch", epoch)
	if t.owned != nil {
		t.owned.Unclaim(t.Now()) // the devices this node holds are claimed again
	}
	return nil
}

// checkFloor asks a Floorer store whether it still has its floor, and
// when it lost it — Redis restarted empty, perhaps between two calls, so
// no call failed — raises it and asks the application to resync its
// watchers (OnRecover): what they show may have been lost with it. Run
// calls it every FlushInterval while the store is up.
func (t *Tracker) checkFloor(ctx context.Context) {
	f := t.link.can.floorer
	if f == nil || !t.link.up() {
		return
	}
	b := t.link.bound(ctx)
	have, err := f.CheckFloor(b.ctx)
	t.link.release(b)
	t.link.partsFailed(err) // a node that only checks floors learns of a part down so too
	if err = t.link.check(ctx, err); err != nil && !partial(err) || have {
		return
	}
	if err := t.resetFloor(ctx); err != nil {
		if ctx.Err() == nil && !errors.Is(err, errOutage) {
			t.log.Warn("raising the version floor of a state store that lost its data failed; will retry", "err", err)
		}
		return
	}
	if t.onRecover != nil {
		t.onRecover()
	}
}

package tracker

import (
	"context"
	"errors"
	"time"

	"github.com/presenced/presenced/internal/presence"
)

// applier applies operations to the store by the ordinary path: a user
// the store does not hold is loaded from the durable store first (Load
// never overwrites), so that every change is applied to state that is
// there. Heartbeats and the other writes take it, and so do the replays
// of the outage and cold buffers and the claims of owned devices.
type applier struct {
	link   *link
	cps    *checkpoints // the durable profiles, with the checkpoints not yet durable
	cold   *cold        // loads fail fast while the durable store does not answer
	floors *floors      // a store that lost its data gets a new floor
	margin uint64       // Config.ReloadMargin
	// timeout is Config.LoadTimeout: it bounds the durable read of a load.
	timeout time.Duration
}

// apply applies o of user to the store, writes its change to ch and, for
// a beat with snap not nil (the store is a BeatReader), fills snap in the
// same call and reports whether it did. Settings are applied at the
// store's now.
func (a *applier) apply(ctx context.Context, user string, o *op, ch *presence.Change, snap *presence.Snapshot) (bool, error) {
	var err error
	switch o.kind {
	case opBeat:
		return a.beatRead(ctx, o.at, user, o.device, o.active, snap, ch)
	case opStatus:
		*ch, err = a.status(ctx, o.at, user, o.manual, o.text)
	case opBye:
		*ch, err = a.bye(ctx, o.at, user, o.device)
	case opSettings:
		*ch, err = a.newSettings(ctx, a.link.now(), user, o.settings)
	}
	return false, err
}

// replayed applies o of user as a replay does, and returns its change.
func (a *applier) replayed(ctx context.Context, user string, o op) (presence.Change, error) {
	var ch presence.Change
	_, err := a.apply(ctx, user, &o, &ch, nil)
	return ch, err
}

// beat applies a beat to the store, loading the user if needed.
func (a *applier) beat(ctx context.Context, now int64, user, device string, active bool) (ch presence.Change, err error) {
	_, err = a.beatRead(ctx, now, user, device, active, nil, &ch)
	return ch, err
}

// beatRead is beat that writes the change to ch and fills snap (if not
// nil: the store is a BeatReader) in the same call, and reports whether
// it did.
func (a *applier) beatRead(ctx context.Context, now int64, user, device string, active bool, snap *presence.Snapshot, ch *presence.Change) (bool, error) {
	beat := func() (read bool, err error) {
		b := a.link.bound(ctx)
		defer a.link.release(b)
		if snap != nil {
			*ch, read, err = a.link.can.beatReader.BeatRead(b.ctx, now, user, device, active, snap)
			return read, err
		}
		*ch, err = a.link.store.Beat(b.ctx, now, user, device, active)
		return false, err
	}
	read, err := beat()
	if err = a.link.checkUser(ctx, user, err); errors.Is(err, ErrNotLoaded) {
		if err = a.load(ctx, user); err != nil {
			return false, err
		}
		read, err = beat()
		err = a.link.checkUser(ctx, user, err)
	}
	return read && err == nil, err
}

func (a *applier) status(ctx context.Context, now int64, user string, m presence.Manual, text string) (presence.Change, error) {
	for try := 0; ; try++ {
		b := a.link.bound(ctx)
		ch, err := a.link.store.SetStatus(b.ctx, now, user, m, text)
		a.link.release(b)
		err = a.link.checkUser(ctx, user, err)
		if errors.Is(err, ErrNotLoaded) && try < 3 {
			if err = a.load(ctx, user); err != nil {
				return ch, err
			}
			continue
		}
		return ch, err
	}
}

func (a *applier) bye(ctx context.Context, now int64, user, device string) (presence.Change, error) {
	b := a.link.bound(ctx)
	ch, err := a.link.store.Bye(b.ctx, now, user, device)
	a.link.release(b)
	return ch, a.link.checkUser(ctx, user, err)
}

// newSettings applies settings s. The store is given the address of
// this copy, which therefore lives on the heap; out of line, that copy
// is made for settings only, not in apply, the path of every heartbeat.
//
//go:noinline
func (a *applier) newSettings(ctx context.Context, now int64, user string, s presence.Settings) (presence.Change, error) {
	return a.settings(ctx, now, user, &s)
}

// settings replaces the settings of user, or with s nil keeps them
// (Store.SetSettings).
func (a *applier) settings(ctx context.Context, now int64, user string, s *presence.Settings) (presence.Change, error) {
	for try := 0; ; try++ {
		b := a.link.bound(ctx)
		ch, err := a.link.store.SetSettings(b.ctx, now, user, s)
		a.link.release(b)
		err = a.link.checkUser(ctx, user, err)
		if errors.Is(err, ErrNotLoaded) && try < 3 {
			if err = a.load(ctx, user); err != nil {
				return ch, err
			}
			continue
		}
		return ch, err
	}
}

// manualStatus is a user's manual status and status text.
type manualStatus struct {
	manual presence.Manual
	text   string
}

// ensure loads a user into the store so that every change is applied to
// state that is already there (Load never overwrites). It returns the
// user's manual status and text as the store holds them.
func (a *applier) ensure(ctx context.Context, user string) (manualStatus, error) {
	var s [1]presence.Snapshot
	b := a.link.bound(ctx)
	err := a.link.store.Get(b.ctx, a.link.now(), []string{user}, s[:])
	a.link.release(b)
	if err = a.link.checkUser(ctx, user, err); err != nil {
		return manualStatus{}, err
	}
	if s[0].Known {
		return manualStatus{s[0].Manual, s[0].Text}, nil
	}
	p, err := a.loadProfile(ctx, user)
	return manualStatus{p.Manual, p.Text}, err
}

func (a *applier) load(ctx context.Context, user string) error {
	_, err := a.loadProfile(ctx, user)
	return err
}

// loadProfile loads a user from the durable store into the store (unless
// it is held already) and returns the durable profile.
func (a *applier) loadProfile(ctx context.Context, user string) (presence.Profile, error) {
	if a.cold.failFast() {
		return presence.Profile{UserID: user}, &profileError{user: user, err: errDurableDown}
	}
	p := presence.Profile{UserID: user}
	lctx, cancel := context.WithTimeout(ctx, a.timeout)
	err := a.cps.profiles(lctx, []string{user}, func(got *presence.Profile) { p = *got }, true)
	cancel()
	if err != nil {
		return p, a.cold.loadFailed(ctx, user, err)
	}
	p.Raise(a.margin, 0) // the store raises it to its floor
	for try := 0; ; try++ {
		b := a.link.bound(ctx)
		err = a.link.store.Load(b.ctx, a.link.now(), &p)
		a.link.release(b)
		if err = a.link.checkUser(ctx, user, err); !errors.Is(err, ErrStoreReset) || try > 0 {
			return p, err
		}
		if err = a.floors.reset(ctx); err != nil {
			return p, err
		}
	}
}

// disconnect records that the connection of device closed at now without
// a bye (Store.Disconnect); a user the store does not hold has no device.
func (a *applier) disconnect(ctx context.Context, now int64, user, device string, since int64) (presence.Change, error) {
	b := a.link.bound(ctx)
	ch, err := a.link.store.Disconnect(b.ctx, now, user, device, since)
	a.link.release(b)
	return ch, a.link.checkUser(ctx, user, err)
}

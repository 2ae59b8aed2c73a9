package tracker

import (
	"context"
	"errors"
	"fmt"

	"github.com/presenced/presenced/internal/owned"
	"github.com/presenced/presenced/internal/presence"
)

// Heartbeat records a heartbeat of a device. It counts as activity unless
// active is false. The common case — a beat that changes nothing visible —
// takes one shard lock and allocates nothing. While the store is down the
// beat is buffered and an empty Change returned (ErrUnavailable if the
// buffer is full).
func (t *Tracker) Heartbeat(ctx context.Context, user, device string, active bool) (ch presence.Change, err error) {
	_, err = t.heartbeatRead(ctx, user, device, active, nil, &ch)
	return ch, err
}

// HeartbeatRead is Heartbeat that, if snap is not nil, also fills it with
// the user's state after the beat — what Get would answer — when the
// store can tell it in the beat's own call (a BeatReader: Redis), and
// reports whether it did. Otherwise (an embedded store, a beat buffered
// or held, a user whose state needs the whole record) the caller reads
// the user.
func (t *Tracker) HeartbeatRead(ctx context.Context, user, device string, active bool, snap *presence.Snapshot) (ch presence.Change, read bool, err error) {
	read, err = t.heartbeatRead(ctx, user, device, active, snap, &ch)
	return ch, read, err
}

// heartbeatRead is HeartbeatRead with the change written to ch: on the
// path of every heartbeat a Change (an Event) is passed down by its
// address rather than copied out of every call.
func (t *Tracker) heartbeatRead(ctx context.Context, user, device string, active bool, snap *presence.Snapshot, ch *presence.Change) (bool, error) {
	if t.link.can.beatCounter == nil {
		t.beats.add()
	}
	if t.link.can.beatReader == nil {
		snap = nil
	}
	o := op{kind: opBeat, at: t.Now(), device: device, active: active}
	kept, read, err := t.write(ctx, user, &o, keepHeld, ch, snap)
	if err != nil && !kept && profileUnavailable(err) {
		// The durable store is down: wait for the profile.
		*ch = presence.Change{}
		_, err = t.cold.hold(user, o, false)
		return false, err
	}
	if err != nil && !kept {
		return false, fmt.Errorf("heartbeat: %w", err)
	}
	return read, err
}

// SocketBeat records a heartbeat of a device through a socket this node
// holds. With a store that implements Leaser the node owns the device
// (docs/internals.md, "Devices a node owns"): the common beat makes no
// store call. Otherwise it is Heartbeat. A beat that needs the store
// while the store is down, or while the user cannot be loaded, succeeds
// with an empty Change: the device is alive here and reaches the store
// when it answers.
func (t *Tracker) SocketBeat(ctx context.Context, user, device string, active bool) (ch presence.Change, err error) {
	err = t.socketBeat(ctx, user, device, active, false, &ch)
	return ch, err
}

// SocketConnect is the first heartbeat of a new socket (active): with a
// Leaser store the device is claimed again whatever this node knew of it,
// since it may have been held by another node meanwhile.
func (t *Tracker) SocketConnect(ctx context.Context, user, device string) (ch presence.Change, err error) {
	err = t.socketBeat(ctx, user, device, true, true, &ch)
	return ch, err
}

// socketBeat is SocketBeat (connect: SocketConnect) with the change
// written to ch, passed down by its address as on every heartbeat's path.
func (t *Tracker) socketBeat(ctx context.Context, user, device string, active, connect bool, ch *presence.Change) error {
	if t.owned == nil {
		_, err := t.heartbeatRead(ctx, user, device, active, nil, ch)
		return err
	}
	t.beats.add()
	return t.owned.beat(ctx, owned.Sockets, user, device, active, connect, ch)
}

// SourceBeat records a heartbeat of a device whose heartbeats reach this
// node from src, a source that no other node consumes while this one
// does (one partition of an ingest stream; src is the caller's number
// for it, not 0). As with SocketBeat, with a Leaser store the node owns
// the device and the common beat makes no store call; connect (a new
// session of the device) claims it again whatever this node knew of it,
// as SocketConnect does. When src moves to another node, HandOffSources
// gives its devices back. Without a Leaser store it is Heartbeat.
func (t *Tracker) SourceBeat(ctx context.Context, src uint32, user, device string, active, connect bool) (ch presence.Change, err error) {
	if t.owned == nil {
		_, err = t.heartbeatRead(ctx, user, device, active, nil, &ch)
		return ch, err
	}
	if src == uint32(owned.Sockets) {
		return ch, errors.New("heartbeat: source 0 is the node's sockets")
	}
	t.beats.add()
	err = t.owned.beat(ctx, owned.Source(src), user, device, active, connect, &ch)
	return ch, err
}

// HandOffSources gives every device whose heartbeats came from one of
// srcs (SourceBeat) back to the store's rules with its real last beat,
// for the node that consumes the source next to claim as its heartbeats
// arrive there. It returns once the store took them, or when ctx ends
// (the rest is handed off when the store answers). A device that beats
// here again meanwhile is claimed again. Without a Leaser store it does
// nothing; source 0 (the sockets) is never handed off.
func (t *Tracker) HandOffSources(ctx context.Context, srcs ...uint32) error {
	if t.owned == nil {
		return nil
	}
	s := make([]owned.Source, 0, len(srcs))
	for _, src := range srcs {
		if src != uint32(owned.Sockets) {
			s = append(s, owned.Source(src))
		}
	}
	return t.owned.handOffSources(ctx, s)
}

// keeping says where an operation waits that the store cannot take now.
type keeping uint8

const (
	keepBuffered keeping = iota // in the outage buffer while the user's part of the store is down
	keepHeld                    // also in the cold buffer while the user waits there for its profile: beats and byes
)

// write applies o of user to the store while the store — the user's part
// of it — is up, and publishes its change; while it is down it keeps o
// for the replay (how says where). A call that finds the store down on
// its first try (errOutage) keeps o the same way. This is the one place
// where the hot path meets an outage. kept reports that o was kept: ch,
// where the change is written, is then empty, and err the buffer's
// refusal, if any. read reports that snap (not nil only for a beat on a
// BeatReader store) was filled. Other errors of the store are returned as
// they are.
func (t *Tracker) write(ctx context.Context, user string, o *op, how keeping, ch *presence.Change, snap *presence.Snapshot) (kept, read bool, _ error) {
	for try := 0; ; try++ {
		if !t.link.upFor(user) || (how == keepHeld && t.cold.waiting()) {
			if ok, err := t.keep(user, *o, how); ok {
				*ch = presence.Change{}
				return true, false, err
			}
		}
		read, err := t.apply.apply(ctx, user, o, ch, snap)
		if try == 0 && errors.Is(err, errOutage) {
			continue // the store is down now: keep the operation
		}
		if err != nil {
			return false, false, err
		}
		t.events.emit(ch)
		return false, read, nil
	}
}

// keep records o for user in a buffer instead of the store: the outage
// buffer while the store is down, else, with keepHeld, the cold buffer
// if user waits there already (so that o is applied after what it
// holds). It reports whether it took o (recorded, or refused with the
// returned error).
func (t *Tracker) keep(user string, o op, how keeping) (bool, error) {
	if !t.link.upFor(user) {
		if ok, err := t.outage.keep(user, o); ok || how == keepBuffered {
			return ok, err
		}
	}
	if how == keepBuffered || !t.cold.waiting() {
		return false, nil
	}
	return t.cold.hold(user, o, true)
}

// SetStatus sets a manual status (ManualNone clears it) and a status text.
// It returns nil only once they are durable, so an invisible user stays
// invisible across restarts.
//
// The durable write and the change of the hot state (with its fan-out)
// run at the same time: a change reaches watchers without waiting for the
// durable store's commit (an fsync), and the caller still hears of success
// only after both. If the durable write fails, the hot state is set back
// to the status and text it had (watchers see the change and its undo) and
// the error returned, so a failed SetStatus leaves the user as it found
// them, as before. After such a failure, and while the store is down, the
// status is written durably first and applied after, one step at a time,
// until a durable write succeeds again: a durable store that keeps failing
// makes no flicker of its own. See docs/internals.md, "Durability".
func (t *Tracker) SetStatus(ctx context.Context, user string, m presence.Manual, text string) (presence.Change, error) {
	mu := t.writes.of(user)
	mu.Lock()
	defer mu.Unlock()
	if t.link.upFor(user) {
		prior, err := t.apply.ensure(ctx, user)
		switch {
		case err == nil && !t.writes.durableFailing.Load():
			return t.setStatusOverlapped(ctx, user, prior, m, text)
		case err != nil && !errors.Is(err, errOutage):
			return presence.Change{}, err
		}
	}
	if err := t.saveStatus(ctx, user, m, text); err != nil {
		return presence.Change{}, fmt.Errorf("set status: %w", err)
	}
	return t.applyStatusSaved(ctx, user, m, text)
}

// setStatusOverlapped writes the status durably while it applies and
// publishes it, and waits for both; see SetStatus. The goroutine of the
// durable write is this call's: it is always waited for.
func (t *Tracker) setStatusOverlapped(ctx context.Context, user string, prior manualStatus, m presence.Manual, text string) (presence.Change, error) {
	saved := make(chan error, 1)
	go func() { saved <- t.saveStatus(ctx, user, m, text) }()
	ch, err := t.apply.status(ctx, t.Now(), user, m, text)
	if err == nil {
		t.events.emit(&ch)
	}
	if derr := <-saved; derr != nil {
		if err == nil {
			t.undoStatus(ctx, user, prior)
		}
		return presence.Change{}, fmt.Errorf("set status: %w", derr)
	}
	if errors.Is(err, errOutage) {
		// The store went down meanwhile: the status is durable, so it is
		// buffered as on the sequential path.
		return t.applyStatusSaved(ctx, user, m, text)
	}
	if err != nil {
		return ch, fmt.Errorf("set status: %w", err)
	}
	return ch, nil
}

// saveStatus is the durable write of a status. A failure that is not the
// caller's own cancellation makes the next status changes sequential
// (durable, then applied) until one succeeds.
func (t *Tracker) saveStatus(ctx context.Context, user string, m presence.Manual, text string) error {
	err := t.durable.SaveStatus(ctx, user, m, text)
	switch {
	case err == nil:
		t.writes.durableFailing.Store(false)
	case ctx.Err() == nil:
		t.writes.durableFailing.Store(true)
	}
	return err
}

// undoStatus sets the hot state of user back to prior after the durable
// write of a status that was applied failed. It publishes the change back.
// The status is not durable, so the undo is never skipped: with the store
// down it is buffered, and another failure is logged (the user's next
// status change, or a reload from the durable store, sets it right).
func (t *Tracker) undoStatus(ctx context.Context, user string, prior manualStatus) {
	ctx = context.WithoutCancel(ctx) // the caller's deadline may be what failed
	o := op{kind: opStatus, at: t.Now(), manual: prior.manual, text: prior.text}
	var ch presence.Change
	if _, _, err := t.write(ctx, user, &o, keepBuffered, &ch, nil); err != nil {
		t.log.Error("could not undo a status that did not become durable", "user", user, "err", err)
	}
}

// applyStatusSaved applies a status that is durable already, or buffers
// it while the store is down.
func (t *Tracker) applyStatusSaved(ctx context.Context, user string, m presence.Manual, text string) (ch presence.Change, err error) {
	o := op{kind: opStatus, at: t.Now(), manual: m, text: text}
	kept, _, err := t.write(ctx, user, &o, keepBuffered, &ch, nil)
	if err != nil && !kept {
		return ch, fmt.Errorf("set status: %w", err)
	}
	return ch, err
}

// Bye ends a device at once (logout, app closed). While the store is down
// the bye is buffered and an empty Change returned.
func (t *Tracker) Bye(ctx context.Context, user, device string) (presence.Change, error) {
	now := t.Now()
	if t.owned != nil {
		if done, ch, err := t.owned.bye(ctx, now, user, device); done {
			if err != nil {
				return ch, fmt.Errorf("bye: %w", err)
			}
			return ch, nil
		}
	}
	o := op{kind: opBye, at: now, device: device}
	var ch presence.Change
	kept, _, err := t.write(ctx, user, &o, keepHeld, &ch, nil)
	if err != nil && !kept {
		return ch, fmt.Errorf("bye: %w", err)
	}
	return ch, err
}

// Disconnect tells the tracker that the connection of a device closed
// without a bye at now; since is the last beat made through that
// connection (Unix ms, the tracker's clock). Unless the device beats again,
// it dies Rules.CloseGrace from now instead of at the end of its ttl, so a
// reconnect within the grace shows nothing and a real departure shows
// quickly; with the grace off (presence.NoCloseGrace) the device ends now.
// Run sweeps when the grace runs out, not at its next tick (wake.go). A
// device that beat after since (it reconnected, here or on another node)
// is left alone. While the store is down nothing is recorded: the device
// then lives its whole ttl, as after missed beats.
func (t *Tracker) Disconnect(ctx context.Context, user, device string, since int64) error {
	now := t.Now()
	if t.owned != nil && t.owned.closed(now, user, device, since) {
		// This node holds the device: its deadline is kept here, and
		// applied (released) by the sweep Run makes when it comes.
		t.closes.add(now + t.rules.GraceMillis())
		return nil
	}
	if !t.link.upFor(user) {
		return nil
	}
	ch, err := t.apply.disconnect(ctx, now, user, device, since)
	if err != nil {
		if errors.Is(err, errOutage) {
			return nil // the device lives its whole ttl
		}
		return fmt.Errorf("disconnect: %w", err)
	}
	// With no grace the store ended it now; a store in another process
	// is swept by the ticker (closeSweep).
	if g := t.rules.GraceMillis(); g > 0 && t.link.can.pinger == nil {
		t.closes.add(now + g)
	}
	t.events.emit(&ch)
	return nil
}

// SetSettings durably replaces a user's privacy settings and applies them
// to the hot state (while the store is down: to the outage buffer).
func (t *Tracker) SetSettings(ctx context.Context, user string, s presence.Settings) error {
	mu := t.writes.of(user)
	mu.Lock()
	defer mu.Unlock()
	if t.link.upFor(user) {
		if _, err := t.apply.ensure(ctx, user); err != nil && !errors.Is(err, errOutage) {
			return err
		}
	}
	if err := t.durable.SaveSettings(ctx, user, s); err != nil {
		return fmt.Errorf("set settings: %w", err)
	}
	// Each watcher whose view changed is sent the new one.
	o := op{kind: opSettings, settings: s}
	var ch presence.Change
	kept, _, err := t.write(ctx, user, &o, keepBuffered, &ch, nil)
	if err != nil && !kept {
		return fmt.Errorf("set settings: %w", err)
	}
	return err
}

// ContactsChanged marks a change of user's contact list (durable before
// the call). When the user's settings show anything to contacts only, it
// stamps the user a new version and publishes it (a change of settings
// that keeps them: nobody is sent anything for it), so that watchers who
// gained or lost sight with the list — the hubs tell them, after it — are
// sent a view above everything they were sent before. While the store is
// down nothing is stamped (the resync after the outage reads every
// watcher's relations again).
func (t *Tracker) ContactsChanged(ctx context.Context, user string) error {
	mu := t.writes.of(user)
	mu.Lock()
	defer mu.Unlock()
	if !t.link.upFor(user) {
		return nil
	}
	var s [1]presence.Snapshot
	if err := t.get(ctx, t.Now(), []string{user}, s[:], false); err != nil {
		return fmt.Errorf("contacts changed: %w", err)
	}
	if set := s[0].Settings; set.Status != presence.Contacts && set.LastSeen != presence.Contacts {
		return nil // the list decides nothing anybody sees
	}
	if _, err := t.apply.ensure(ctx, user); err != nil {
		return fmt.Errorf("contacts changed: %w", err)
	}
	ch, err := t.apply.settings(ctx, t.Now(), user, nil)
	if err != nil {
		return fmt.Errorf("contacts changed: %w", err)
	}
	t.events.emit(&ch)
	return nil
}

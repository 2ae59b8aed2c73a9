package tracker

import (
	"context"
	"errors"
	"fmt"

	"github.com/presenced/presenced/internal/presence"
)

// ErrNotLoaded is returned by a Store for an operation on a user whose
// profile it does not hold; the tracker then loads the profile from the
// durable store, calls Load and tries again.
var ErrNotLoaded = errors.New("tracker: user not loaded")

// ErrStoreReset is returned by a Store's Load when the store lost its
// data since versions were last published from it (a Redis restarted
// empty): counting on from the durable copy could repeat a lost version.
// The tracker then raises the store's floor (Floorer) above every version
// of before and loads again.
var ErrStoreReset = errors.New("tracker: the state store lost its data")

// PartialError is returned by a Store when a call failed for some of its
// keys only — a Redis Cluster whose one master is down, the others
// answering — and did the rest. For Get, Failed lists the indexes of the
// ids whose snapshots are missing; for a sweep (Expire, ExpireParts), a
// takeover (TakeOver, TakeOverParts) or the floors (CheckFloor,
// RaiseFloor) of a Partitioned store, Parts lists the parts that did not
// answer (the tracker marks them down; Dirty does not name them); a join
// or leave of a room (RoomStore) whose user's side was written and whose
// room's side failed names none. The tracker does not take
// such a failure for an outage of the whole store: only the users of the
// keys that failed are affected.
type PartialError struct {
	Failed []int
	Parts  []int
	Err    error
}

func (e *PartialError) Error() string {
	return fmt.Sprintf("%d keys failed: %v", len(e.Failed), e.Err)
}

func (e *PartialError) Unwrap() error { return e.Err }

// BeatReader is an optional ability of a Store in another process: Beat
// that also fills snap (when not nil) with the user at now after the
// beat — what Get would answer — in the same round trip, and reports
// whether it did.
type BeatReader interface {
	BeatRead(ctx context.Context, now int64, user, device string, active bool, snap *presence.Snapshot) (presence.Change, bool, error)
}

// PartSweeper is an optional ability of a Partitioned store: Expire
// leaving alone the parts skip names. The tracker does not sweep a part
// that is down or being replayed, nor one for RecoverGrace after it came
// back: its users' beats of the outage may still wait in this node's
// buffer, or in another node's.
//
// DirtyParts is Dirty leaving alone the parts skip names: a checkpoint
// does not wait on a part that is down (it holds back loads meanwhile);
// its users' dirty set waits in the store for the next checkpoint after
// the part is back.
type PartSweeper interface {
	ExpireParts(ctx context.Context, now int64, max int, skip func(part int) bool, out []presence.Change) ([]presence.Change, error)
	DirtyParts(ctx context.Context, skip func(part int) bool, out []presence.Profile) ([]presence.Profile, error)
}

// PartTakeOver is an optional ability of a Partitioned Leaser: TakeOver
// leaving alone the parts skip names (those down: a Cluster master that
// does not answer would use up the call's time, and the other parts'
// devices would stay held by a dead lease until it is back). Parts that
// did not answer are named in a PartialError's Parts.
type PartTakeOver interface {
	TakeOverParts(ctx context.Context, now int64, lease uint64, renewed int64,
		lastSeen func(ctx context.Context, users []string) (map[string]int64, error), skip func(part int) bool,
		out []presence.Change) ([]presence.Change, error)
}

// Floorer is an optional ability of a Store that lives apart from the node
// and may lose its data (Redis): a version floor that every user loaded
// counts on from. RaiseFloor raises it (never lowers it); CheckFloor
// reports false if the store lost it, i.e. lost its data.
type Floorer interface {
	RaiseFloor(ctx context.Context, floor uint64) error
	CheckFloor(ctx context.Context) (bool, error)
}

// Pinger is an optional ability of a Store: a cheap round trip that tells
// whether the store answers. While the store is down Run probes it with
// Ping; a Store without it is probed with a Get of one id. A Store with
// it lives in another process: every call to it is bounded by
// Config.StoreTimeout.
type Pinger interface {
	Ping(ctx context.Context) error
}

// BeatCounter is an optional ability of a Store: it counts the heartbeats
// it applies where that costs nothing (under a lock it holds anyway), so the
// tracker need not bump a counter shared between cores on every beat.
type BeatCounter interface {
	Beats() uint64
}

// Partitioned is an optional ability of a Store whose parts fail apart: a
// Redis Cluster, where each master holds some shards. The users of one
// part live there only (every key of a user is in its part). A store
// that fails as a whole (one Redis) is not Partitioned, or says 1.
//
// With it an outage of one part is that part's users' alone: a write for
// a user whose part does not answer puts that part down — the user's
// operations, and those of every user of the part, are buffered as in an
// outage of the whole store, reads of them are degraded — while the users
// of the other parts go on as if nothing happened. Run probes each part
// that is down with PingPart and replays its users' buffer when it
// answers.
type Partitioned interface {
	Parts() int
	Part(user string) int
	PingPart(ctx context.Context, part int) error
}

// SharedStore is a Store that lives in another process and is shared by
// the nodes of a deployment (redisstore): everything such a store does
// beyond Store. memstore is none. New finds once what its Store can do
// (abilities); a Store may also have only some of these abilities.
type SharedStore interface {
	Store
	Pinger
	Floorer
	BeatReader
	Partitioned
	PartSweeper
	Leaser
	PartTakeOver
}

// abilities are what a Store can do beyond Store, found once by New: nil
// where it cannot.
type abilities struct {
	pinger       Pinger // the store lives in another process
	floorer      Floorer
	beatReader   BeatReader
	beatCounter  BeatCounter
	partitioned  Partitioned
	partSweeper  PartSweeper
	leaser       Leaser
	partTakeOver PartTakeOver
	rooms        RoomStore
}

func abilitiesOf(s Store) abilities {
	var a abilities
	a.beatCounter, _ = s.(BeatCounter)
	a.rooms, _ = s.(RoomStore)
	if sh, ok := s.(SharedStore); ok {
		a.pinger, a.floorer, a.beatReader, a.partitioned = sh, sh, sh, sh
		a.partSweeper, a.leaser, a.partTakeOver = sh, sh, sh
		return a
	}
	a.pinger, _ = s.(Pinger)
	a.floorer, _ = s.(Floorer)
	a.beatReader, _ = s.(BeatReader)
	a.partitioned, _ = s.(Partitioned)
	a.partSweeper, _ = s.(PartSweeper)
	a.leaser, _ = s.(Leaser)
	a.partTakeOver, _ = s.(PartTakeOver)
	return a
}

// EpochCounter is an optional ability of a Durable: it hands out a new
// epoch, above every one handed out before to any node (the boot counter
// of presence.Rules.Epoch).
type EpochCounter interface {
	NextEpoch(ctx context.Context) (uint64, error)
}

// Store holds the hot state of users and the index of their deadlines. It
// applies each operation atomically per user with the rules of
// presence.User. Times are Unix milliseconds. Implementations are safe for
// concurrent use.
type Store interface {
	// Beat applies a heartbeat of device (ErrNotLoaded if the user is not held).
	Beat(ctx context.Context, now int64, user, device string, active bool) (presence.Change, error)
	// SetStatus sets the manual status and text (ErrNotLoaded if not held).
	SetStatus(ctx context.Context, now int64, user string, m presence.Manual, text string) (presence.Change, error)
	// Bye ends one device at once; a user who is not held has no device.
	Bye(ctx context.Context, now int64, user, device string) (presence.Change, error)
	// Disconnect records that device's connection closed at now without a
	// bye, its last beat through that connection at since
	// (presence.User.Disconnect); a user who is not held has no device.
	Disconnect(ctx context.Context, now int64, user, device string, since int64) (presence.Change, error)
	// SetSettings replaces the privacy settings of a held user
	// (ErrNotLoaded if not held), or with s nil keeps them, and returns
	// the change it always makes (presence.User.SetSettings: a new
	// version, SettingsOnly) — with s nil, the mark of a change of who
	// may see the user that is not in the settings (a contact list).
	SetSettings(ctx context.Context, now int64, user string, s *presence.Settings) (presence.Change, error)
	// Load inserts a user from its durable profile unless it is held already.
	Load(ctx context.Context, now int64, p *presence.Profile) error
	// Expire applies every deadline due by now, up to max changes, and
	// appends the changes to out. Any number of callers may sweep at once;
	// each change is returned exactly once.
	Expire(ctx context.Context, now int64, max int, out []presence.Change) ([]presence.Change, error)
	// Get fills out[i] with the state of ids[i] at now; Known is false for
	// users the store does not hold. len(out) must be len(ids).
	Get(ctx context.Context, now int64, ids []string, out []presence.Snapshot) error
	// Dirty appends to out the profiles whose last_seen or version changed
	// since the previous call, and forgets them.
	Dirty(ctx context.Context, out []presence.Profile) ([]presence.Profile, error)
	// Debug returns a copy of the hot state of a user and its next deadline.
	Debug(ctx context.Context, user string) (u presence.User, deadline int64, ok bool, err error)
}

// Durable is the durable store as the tracker needs it: profiles in,
// last_seen checkpoints out. Implementations are safe for concurrent use.
type Durable interface {
	// LoadProfiles calls fn for each of ids that has a durable record.
	LoadProfiles(ctx context.Context, ids []string, fn func(*presence.Profile)) error
	// SaveStatus durably records a manual status and text and, in the
	// same write, the public face that goes with them
	// (presence.Profile.SaveStatus: a text set while invisible is never
	// read from the record as everyone's). The tracker calls it while it
	// applies and publishes the status, and acknowledges the status only
	// once it returned nil; a store should commit concurrent calls
	// together (internal/groupcommit).
	SaveStatus(ctx context.Context, user string, m presence.Manual, text string) error
	// SaveSettings durably records privacy settings, before they are applied.
	SaveSettings(ctx context.Context, user string, s presence.Settings) error
	// SaveLastSeen writes a batch of last_seen checkpoints in one transaction
	// (group commit). Only LastSeen, PubLastSeen and Version are written,
	// each only forwards, and with the newest version the public face
	// (where Profile.Frozen, none otherwise; none leaves an invisible
	// user's face: presence.Profile.Checkpoint).
	SaveLastSeen(ctx context.Context, batch []presence.Profile) error
}

// Publisher receives every change of presence: of what others see, and
// of what only the user sees (presence.Event.SelfOnly). Changes of one user
// made by concurrent operations may reach Publish out of order; each event
// carries the whole visible state and a version that grows with every
// change, so a consumer applies an event only if its version is above the
// last one it applied for that user. The *Event is valid only during the
// call. Publish must not block for long: the bus owns its queues.
type Publisher interface {
	Publish(ev *presence.Event)
}

// Leaser is an optional ability of a Store shared by several nodes
// (Redis): devices owned by the node that holds their sockets (package
// owned). The owner keeps an owned device's deadline itself, and the
// store holds the device alive until the owner releases it, hands it off,
// or the owner's lease is taken over; each node holds a lease that it
// renews every LeaseInterval. See docs/internals.md, "Devices a node
// owns".
type Leaser interface {
	// AcquireLease registers lease (unique among all nodes, ever) as
	// renewed at now.
	AcquireLease(ctx context.Context, lease uint64, now int64) error
	// RenewLease renews lease at now and appends every lease the store
	// holds to out. ErrLeaseLost if lease is gone or being taken over.
	RenewLease(ctx context.Context, lease uint64, now int64, out []Lease) ([]Lease, error)
	// TakeLease marks a lease last renewed at renewed as being taken
	// over, unless it was renewed since (or is marked already); it
	// reports whether this call marked it.
	TakeLease(ctx context.Context, lease uint64, renewed, now int64) (bool, error)
	// EndLease forgets a lease.
	EndLease(ctx context.Context, lease uint64) error
	// TakeOver gives every device that lease owns back to the rules with
	// renewed as its last beat, and returns the changes that are due at
	// once. lastSeen, if not nil, is asked for the durable last_seen of
	// the users concerned (newer than the store's). Each device is taken
	// over once, whoever calls.
	TakeOver(ctx context.Context, now int64, lease uint64, renewed int64,
		lastSeen func(ctx context.Context, users []string) (map[string]int64, error), out []presence.Change) ([]presence.Change, error)
	// Claim makes device owned by lease, applied like a heartbeat at now
	// with the owner's last beat and activity. ErrNotLoaded,
	// presence.ErrTooManyDevices, or ErrClaimStale if another owner took
	// the device after the last beat this owner saw.
	Claim(ctx context.Context, now int64, lease uint64, user string, d OwnedDevice) (presence.Change, error)
	// Touch tells the store the last beats and activity of devices lease
	// owns, for many users at once, and sets each touch's outcome: its
	// change, the devices lease does not own (Lost), ErrNotLoaded for a
	// user not held at all.
	Touch(ctx context.Context, now int64, lease uint64, touches []Touch)
	// Release ends devices lease owns (bye: said bye at now; otherwise
	// their ttl or close grace ran out on the owner), and returns the
	// listed devices it did not own.
	Release(ctx context.Context, now int64, lease uint64, user string, devs []OwnedDevice, bye bool) (presence.Change, []string, error)
	// HandOff gives devices lease owns back to the rules with their real
	// last beats (a node that stops), and returns those it did not own.
	HandOff(ctx context.Context, now int64, lease uint64, user string, devs []OwnedDevice) (presence.Change, []string, error)
}

// Lease is a node's lease as a store holds it.
type Lease struct {
	ID      uint64
	Renewed int64 // its last renewal, Unix ms by the owner's clock
	Taken   bool  // another node is taking it over
	TakenAt int64 // when it was marked (by the taker's clock)
}

// Touch is one user's devices told to the store (Leaser.Touch), and
// what the store answered.
type Touch struct {
	User    string
	Devices []OwnedDevice

	Change presence.Change
	Lost   []string
	Err    error
}

// OwnedDevice is what an owner tells the store of one of its devices.
type OwnedDevice struct {
	ID       string
	LastBeat int64
	// LastActive is presence.Forever while the owner holds the device
	// active (it says when that turns idle), else its last activity.
	LastActive int64
}

// ErrLeaseLost is returned by RenewLease when the node's lease was taken
// over (or lost with the store's data): the node claims its devices again
// under a new lease.
var ErrLeaseLost = errors.New("tracker: this node's lease was taken over")

// ErrClaimStale is returned by Claim when another node holds the device
// since after the claimant's last beat of it: the device moved there.
var ErrClaimStale = errors.New("tracker: the device is held by another node")

// ErrTakeOverLeft is returned (wrapped) by TakeOver when it stopped for
// want of time before the end: the changes it returned are taken over,
// the rest is left for the next call (the next lease tick). It is not an
// outage.
var ErrTakeOverLeft = errors.New("tracker: takeover not finished in time; the rest is left for the next call")

// ErrNotReplicated is returned (wrapped) by a Leaser call whose write the
// store applied but could not make safe against the loss of its primary
// (not every replica has it: redisstore's WAIT). It is not acknowledged:
// the work is retried like any failed claim or release, and the store is
// not taken for down (it answers; its replication lags or is cut off).
var ErrNotReplicated = errors.New("tracker: the write did not reach every replica in time")

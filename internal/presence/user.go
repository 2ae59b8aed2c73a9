package presence

import "time"

// Rules are the rules of the state model that a deployment chooses.
type Rules struct {
	TTL       time.Duration // a device is alive while now < last_beat + TTL
	IdleAfter time.Duration // online turns away after this long without activity
	// MaxDevices caps the alive devices of one user; 0 means
	// DefaultMaxDevices. A heartbeat of one more device is refused.
	MaxDevices int
	// CloseGrace is how long a device stays alive after its connection
	// closed without a bye (User.Disconnect), unless it beats again; never
	// longer than TTL. A reconnect within it shows nothing to anyone, a
	// real departure shows within it instead of the TTL. Zero means
	// DefaultCloseGrace; NoCloseGrace turns the grace off (the device ends
	// the moment its connection closes, as if the grace ran out then); a
	// value at or above TTL leaves the device its whole TTL, as after
	// missed beats.
	CloseGrace time.Duration
	// Epoch numbers the runs of the state store's owner (a boot counter
	// kept in the durable store). Versions stamped in a run start above
	// Epoch<<32, so they keep growing across restarts even when the last
	// checkpoint was lost, and say nothing about wall-clock time.
	Epoch uint64
}

// DefaultMaxDevices is the cap of alive devices per user.
const DefaultMaxDevices = 32

// MaxMaxDevices is the largest cap of alive devices per user a node takes
// (-max-devices): a user's devices are counted in 16 bits where they are
// stored, and a thousand is already far beyond any person's devices.
const MaxMaxDevices = 1000

// Default rules: what a deployment gets for a zero TTL, IdleAfter or
// MaxDevices.
const (
	DefaultTTL        = 30 * time.Second
	DefaultIdleAfter  = 5 * time.Minute
	DefaultCloseGrace = 5 * time.Second
)

// SocketBeatInterval is the interval a WebSocket client is told to beat
// at for a ttl (the welcome's heartbeat_interval_ms): half of it. Beats on
// one TCP connection are never lost one by one: they arrive late, or the
// connection breaks and the reconnect beats at once. So one interval with
// +10% jitter (0.55 × ttl) leaves 0.45 × ttl for a beat delayed by
// retransmissions, and each socket costs the node half the wake-ups (and
// a phone half the radio wake-ups) of ttl/4.
func SocketBeatInterval(ttl time.Duration) time.Duration { return ttl / 2 }

// HTTPBeatInterval is the interval a device beating over HTTP is told to
// beat at for a ttl: a quarter of it, because a request can fail on its
// own — with +10% jitter two lost beats in a row still leave the third
// inside the ttl with room for latency (3 × 1.1 × ttl/4 = 0.825 × ttl).
func HTTPBeatInterval(ttl time.Duration) time.Duration { return ttl / 4 }

// NoCloseGrace is the CloseGrace that turns the grace off: a device whose
// connection closed without a bye ends at once (-close-grace 0). Any
// negative CloseGrace counts as it; the zero value means the default.
const NoCloseGrace time.Duration = -1

// DefaultMaxSubscriptions is the default cap of the users one connection
// may watch: the server's (fanout, gateway) and the Go client's.
const DefaultMaxSubscriptions = 500

// WithDefaults returns r with its zero (or negative) TTL, IdleAfter and
// MaxDevices and its zero CloseGrace replaced by the defaults, a negative
// CloseGrace made NoCloseGrace, and CloseGrace capped at TTL.
func (r Rules) WithDefaults() Rules {
	if r.TTL <= 0 {
		r.TTL = DefaultTTL
	}
	if r.IdleAfter <= 0 {
		r.IdleAfter = DefaultIdleAfter
	}
	if r.MaxDevices <= 0 {
		r.MaxDevices = DefaultMaxDevices
	}
	switch {
	case r.CloseGrace == 0:
		r.CloseGrace = DefaultCloseGrace
	case r.CloseGrace < 0:
		r.CloseGrace = NoCloseGrace
	}
	r.CloseGrace = min(r.CloseGrace, r.TTL)
	return r
}

// CloseGraceOff reports whether the close grace is off (NoCloseGrace).
func (r *Rules) CloseGraceOff() bool { return r.CloseGrace < 0 }

// GraceMillis is how long (ms) a device lives after its connection
// closed without a bye: 0 with the grace off, the TTL for a zero
// CloseGrace (Rules not passed through WithDefaults) or one above it.
func (r *Rules) GraceMillis() int64 {
	ttl := r.TTL.Milliseconds()
	if r.CloseGrace < 0 {
		return 0
	}
	g := r.CloseGrace.Milliseconds()
	if g <= 0 || g > ttl {
		g = ttl
	}
	return g
}

// End returns the moment (Unix ms) at which d dies unless it beats again:
// its last beat plus the TTL or, if its connection closed without a bye,
// the close plus CloseGrace, whichever comes first (GraceMillis: the
// close itself with NoCloseGrace; a zero CloseGrace counts as the TTL).
func (r *Rules) End(d *Device) int64 {
	if d.Owner != 0 {
		return Forever
	}
	ttl := r.TTL.Milliseconds()
	end := d.LastBeat + ttl
	if d.Closed > 0 {
		end = min(end, d.Closed+r.GraceMillis())
	}
	return end
}

func (r *Rules) maxDevices() int {
	if r.MaxDevices > 0 {
		return r.MaxDevices
	}
	return DefaultMaxDevices
}

// Device is the state of one device of a user. Times are Unix milliseconds.
type Device struct {
	ID         string
	LastBeat   int64
	LastActive int64 // 0: never reported active
	// Closed is when the device's connection closed without a bye, 0 if
	// it did not (or beat again since): it then dies at Rules.End.
	Closed int64
	// Owner, if not 0, is the lease of the node that holds the device's
	// socket (scale-out: the node keeps the device's deadline itself and
	// tells the shared store only what others must see). An owned device
	// never ends by the rules (Rules.End is Forever): it lives until its
	// owner ends it or the owner's lease is taken over. LastBeat and
	// LastActive are then what the owner last reported.
	Owner uint64
}

// Forever is the end of a device that a node owns (Device.Owner): later
// than any time, and exact as a float64 (Lua's numbers).
const Forever int64 = 1 << 52

// User is the hot state of one user: the durable Profile plus the devices
// and the last status that was published. Its methods apply one operation
// each and report whether the visible presence changed; they are the one
// place where the rules of the state model live.
//
// What everyone else sees of the user is its public face: Pub,
// PubLastSeen, PubText and PubVersion, set by each change published to
// them. While the user is invisible the face is frozen as it was when
// they vanished — exactly what a logout then would have left: a change of
// their text is told to the user alone (SetStatus).
type User struct {
	Profile
	Devices []Device
	Pub     Status // last published public status
}

// NewUser returns the hot state of a user loaded from its durable profile
// (a public version above the version counts as the version: Profile.Raise).
func NewUser(p Profile) *User {
	p.Raise(0, 0)
	return &User{Profile: p, Pub: Offline}
}

// Beat applies a heartbeat of device at now (Unix ms). A heartbeat counts as
// activity unless active is false. A new device beyond Rules.MaxDevices
// alive ones is refused with ErrTooManyDevices and changes nothing.
func (u *User) Beat(r *Rules, now int64, device string, active bool) (Change, error) {
	i := u.device(device)
	if i < 0 {
		if len(u.Devices) >= r.maxDevices() && u.AliveDevices(r, now) >= r.maxDevices() {
			return Change{}, ErrTooManyDevices
		}
		u.Devices = append(u.Devices, Device{ID: device})
		i = len(u.Devices) - 1
	}
	d := &u.Devices[i]
	if now > d.LastBeat {
		d.LastBeat = now
	}
	if d.Closed != 0 && now > d.Closed {
		d.Closed = 0 // it reconnected: the close is forgotten
	}
	if active && now > d.LastActive {
		d.LastActive = now
	}
	if now > u.LastSeen {
		u.LastSeen = now
	}
	return u.settle(r, now), nil
}

// SetStatus sets (or with ManualNone clears) the manual status and the
// status text. A text that changes while the user is invisible changes
// nothing anyone else sees: it is a change the user alone is told
// (Event.SelfOnly), with a new version that only the user sees.
func (u *User) SetStatus(r *Rules, now int64, m Manual, text string) Change {
	// Choosing a status with a device alive is a sign of life: the user is
	// here now. (So coming back from invisible shows this moment, exactly
	// like a real return does.)
	if now > u.LastSeen && u.AliveDevices(r, now) > 0 {
		u.LastSeen = now
	}
	old := u.Text
	u.Manual = m
	u.Text = text
	ch := u.settle(r, now)
	if ch.Changed || text == old {
		return ch
	}
	if u.PubVersion == 0 {
		// A user never shown to anyone has a face at version 0, which
		// reads as "the face is the user's own" (Profile.Public): it takes
		// a version below the change's, so that it stays frozen wherever
		// it is kept — the floor of the epoch (what a read of a user not
		// held already shows, and where redisstore loads one), or in epoch
		// 0 a version of its own. Nothing is published.
		if u.PubVersion = r.Epoch << 32; u.PubVersion == 0 {
			u.PubVersion = u.nextVersion(r)
		}
		u.Version = max(u.Version, u.PubVersion)
	}
	v := u.nextVersion(r)
	u.Version = v
	return Change{Changed: true, Event: Event{
		UserID:   u.UserID,
		Status:   u.Pub,
		Prev:     u.Pub,
		Text:     u.PubText,
		LastSeen: u.PubLastSeen,
		Version:  v,
		At:       now,
		Settings: u.Settings,
		Self:     u.Status(r, now),
		SelfText: u.Text,
		SelfOnly: true,
	}}
}

// Bye ends one device at once. The moment of the bye counts as the user's
// last sign of life.
func (u *User) Bye(r *Rules, now int64, device string) Change {
	if i := u.device(device); i >= 0 {
		if u.alive(r, &u.Devices[i], now) && now > u.LastSeen {
			u.LastSeen = now
		}
		u.Devices = append(u.Devices[:i], u.Devices[i+1:]...)
	}
	return u.settle(r, now)
}

// Disconnect records that the connection of device closed at now without a
// bye: unless it beats again, the device dies CloseGrace after now (or at
// the end of its TTL if that comes first). since is the last beat the
// closed connection made; a device that beat later than that has another
// connection (a reconnect, possibly to another node) and is left alone, as
// is an unknown or already closed device.
func (u *User) Disconnect(r *Rules, now int64, device string, since int64) Change {
	if i := u.device(device); i >= 0 {
		if d := &u.Devices[i]; d.LastBeat <= since && d.Closed == 0 {
			d.Closed = now
		}
	}
	return u.settle(r, now)
}

// Expire drops the devices whose ttl ran out by now and applies what follows
// (offline when the last one died, away when idle).
func (u *User) Expire(r *Rules, now int64) Change {
	return u.settle(r, now)
}

// Status returns the true status at now (Invisible included).
func (u *User) Status(r *Rules, now int64) Status {
	alive := false
	var active int64
	for i := range u.Devices {
		d := &u.Devices[i]
		if u.alive(r, d, now) {
			alive = true
			if d.LastActive > active {
				active = d.LastActive
			}
		}
	}
	switch {
	case !alive:
		return Offline
	case u.Manual != ManualNone:
		return u.Manual.Status()
	case active > 0 && now < active+r.IdleAfter.Milliseconds():
		return Online
	}
	return Away
}

// AliveDevices counts the devices alive at now.
func (u *User) AliveDevices(r *Rules, now int64) int {
	n := 0
	for i := range u.Devices {
		if u.alive(r, &u.Devices[i], now) {
			n++
		}
	}
	return n
}

// Deadline returns the next moment (Unix ms) at which the user's state may
// change without any input — a device's ttl running out, or going idle — or
// 0 if nothing is pending. Owned devices (Device.Owner) count for neither:
// their owner ends them and says when their activity is idle_after old.
// It only ever moves later on a heartbeat.
func (u *User) Deadline(r *Rules, now int64) int64 {
	var next, active int64
	for i := range u.Devices {
		d := &u.Devices[i]
		if d.Owner != 0 {
			continue // its owner ends it, and says when it is idle
		}
		end := r.End(d)
		if next == 0 || end < next {
			next = end
		}
		if end > now && d.LastActive > active {
			active = d.LastActive
		}
	}
	if u.Manual == ManualNone && active > 0 {
		if idle := active + r.IdleAfter.Milliseconds(); idle > now && (next == 0 || idle < next) {
			next = idle
		}
	}
	return next
}

// Snapshot fills s with the true state of u at now, its public face
// included.
func (u *User) Snapshot(r *Rules, now int64, s *Snapshot) {
	*s = Snapshot{
		UserID:      u.UserID,
		Known:       true,
		Status:      u.Status(r, now),
		Manual:      u.Manual,
		Text:        u.Text,
		LastSeen:    u.LastSeen,
		PubLastSeen: u.PubLastSeen,
		Devices:     u.AliveDevices(r, now),
		Version:     u.Version,
		Settings:    u.Settings,
		PubText:     u.PubText,
		PubVersion:  u.PubVersion,
	}
}

func (u *User) device(id string) int {
	for i := range u.Devices {
		if u.Devices[i].ID == id {
			return i
		}
	}
	return -1
}

func (u *User) alive(r *Rules, d *Device, now int64) bool {
	return now < r.End(d)
}

// settle drops dead devices, derives the public status and, if it or the
// status text changed, stamps a new version and returns the event.
func (u *User) settle(r *Rules, now int64) Change {
	// Drop dead devices in place (no allocation).
	live := u.Devices[:0]
	for _, d := range u.Devices {
		if u.alive(r, &d, now) {
			live = append(live, d)
		}
	}
	for i := len(live); i < len(u.Devices); i++ {
		u.Devices[i] = Device{}
	}
	u.Devices = live

	self := u.Status(r, now)
	pub := self.Public()
	prev := u.Pub
	// While the user is publicly present, the public last_seen follows the
	// true one. When they vanish it freezes: at their last sign of life if
	// their devices died or said bye, and at this very moment if they went
	// invisible — exactly what a bye at this moment would show, so nothing
	// tells the two apart.
	switch {
	case pub != Offline:
		u.PubLastSeen = u.LastSeen
	case prev != Offline && self == Invisible:
		u.PubLastSeen = max(u.LastSeen, now)
	case prev != Offline:
		u.PubLastSeen = u.LastSeen
	}
	// An invisible user who shows offline already: the public face stays
	// as it was when they vanished, text included — also the face of a
	// user never shown at all (invisible from the start: the text they
	// set is theirs alone, SetStatus).
	if pub == prev && (u.Text == u.PubText || u.Manual == ManualInvisible) {
		return Change{}
	}
	u.Pub = pub
	u.PubText = u.Text
	return Change{Changed: true, Event: u.event(r, now, prev, self)}
}

// nextVersion returns the version of the user's next change: above its
// last and above the floor of the epoch.
func (u *User) nextVersion(r *Rules) uint64 {
	v := u.Version + 1
	if floor := r.Epoch << 32; v <= floor {
		v = floor + 1
	}
	return v
}

// event stamps a new version and returns the event of the published
// state, whose public status was prev before: everyone may see it, so
// the public version is the new one.
func (u *User) event(r *Rules, now int64, prev, self Status) Event {
	v := u.nextVersion(r)
	u.Version, u.PubVersion = v, v
	return Event{
		UserID:   u.UserID,
		Status:   u.Pub,
		Prev:     prev,
		Text:     u.PubText,
		LastSeen: u.PubLastSeen,
		Version:  v,
		At:       now,
		Settings: u.Settings,
		Self:     self,
		SelfText: u.Text,
	}
}

// SetSettings replaces the privacy settings. It always stamps a new
// version and returns the change (SettingsOnly, with the settings before):
// a watcher who loses or gains sight of the user is sent its new view
// with a version above everything it was sent, and a caller marks a
// change of who may see the user that is not in the settings (a contact
// list) by setting the same settings again.
func (u *User) SetSettings(r *Rules, now int64, s Settings) Change {
	prev := u.Settings
	u.Settings = s
	self := u.Status(r, now)
	if self.Public() != u.Pub {
		self = u.Pub // a change the next sweep publishes: not yet
	}
	ev := u.event(r, now, u.Pub, self)
	ev.SettingsOnly, ev.SettingsChanged, ev.PrevSettings = true, true, prev
	return Change{Changed: true, Event: ev}
}

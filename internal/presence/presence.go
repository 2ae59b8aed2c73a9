// Package presence is the domain model of presenced: statuses, privacy
// settings, the per-user state machine that derives a user's status from the
// heartbeats of their devices, and the values that flow between the tracker,
// the stores and the readers.
//
// Everything here is pure logic over values; nothing blocks or keeps time.
// The types are not safe for concurrent use: a store guards each User with
// its own lock (memory) or applies the same rules atomically (Redis).
package presence

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Status is what a user shows. Offline, Online and Away are derived from the
// devices; Busy, Away and Invisible can also be set by hand.
type Status uint8

// Statuses. The zero value is Offline.
const (
	Offline Status = iota
	Online
	Away
	Busy
	Invisible // only ever shown to the user themselves; everyone else sees Offline
)

var statusNames = [...]string{"offline", "online", "away", "busy", "invisible"}

// String returns the wire name of s ("offline", "online", ...).
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Public is the status everyone but the user sees: Invisible reads Offline.
func (s Status) Public() Status {
	if s == Invisible {
		return Offline
	}
	return s
}

// Manual is a status set by hand. ManualNone means "derive from activity".
type Manual uint8

// Manual statuses.
const (
	ManualNone Manual = iota
	ManualAway
	ManualBusy
	ManualInvisible
)

// Status returns the status a manual setting shows while a device is alive.
func (m Manual) Status() Status {
	switch m {
	case ManualAway:
		return Away
	case ManualBusy:
		return Busy
	case ManualInvisible:
		return Invisible
	}
	return Online
}

// String returns the wire name of m; ManualNone is "online" (setting
// "online" clears a manual status).
func (m Manual) String() string { return m.Status().String() }

// ErrUnknownStatus is returned by ParseManual for anything but the four
// statuses a user may set.
var ErrUnknownStatus = errors.New("unknown status: want one of online, away, busy, invisible")

// ParseManual parses a status a user asks for: "online" clears the manual
// status, "away", "busy" and "invisible" set it.
func ParseManual(s string) (Manual, error) {
	switch s {
	case "online":
		return ManualNone, nil
	case "away":
		return ManualAway, nil
	case "busy":
		return ManualBusy, nil
	case "invisible":
		return ManualInvisible, nil
	}
	return 0, ErrUnknownStatus
}

// Limits on identifiers, texts, devices and contact lists.
const (
	MaxIDLen    = 64    // bytes, for user and device ids
	MaxTextLen  = 140   // characters (Unicode code points) of a status text
	MaxContacts = 10000 // entries in one user's contact list
)

// ErrTooManyContacts is returned by a durable store when a change would take
// a contact list past MaxContacts; nothing is changed.
var ErrTooManyContacts = fmt.Errorf("a contact list may hold at most %d users", MaxContacts)

// ErrTooManyDevices is returned when a user's new device would exceed
// Rules.MaxDevices alive devices; nothing is changed.
var ErrTooManyDevices = errors.New("too many devices alive for this user")

// ValidateID reports whether s may be used as a user or device id: 1 to 64
// bytes of valid UTF-8 without spaces, commas (the batch read separates ids
// by commas), control characters, bidirectional overrides, line separators
// or U+FFFD (which is what invalid bytes in a JSON body decode to, so two
// different raw ids could otherwise become one), in Unicode normalization
// form NFC. Numeric and UUID ids pass.
//
// NFC: "café" typed on one system and read back from another may arrive
// as é (U+00E9) or as e and a combining acute (U+0065 U+0301), which are
// the same text by Unicode's definition but two byte strings, so they
// would be two users. An id not in NFC is refused (not normalised: what
// the app stores and what the node stores must be one string), which
// takes one of each such pair, and the Kelvin and Ohm signs (whose NFC is
// K and Ω). Look-alikes that are different characters — full-width Ａ and
// A, Cyrillic а and Latin a — stay different ids, as they are different
// text: ids are the app's identifiers, not names to be matched, and
// folding them here would make two of the app's users one.
func ValidateID(s string) error {
	if s == "" {
		return errors.New("id is empty")
	}
	if len(s) > MaxIDLen {
		return fmt.Errorf("id is %d bytes long, the limit is %d", len(s), MaxIDLen)
	}
	ascii := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= utf8.RuneSelf {
			ascii = false
			continue
		}
		if c < 0x21 || c == ',' || c == 0x7f {
			return fmt.Errorf("id contains a forbidden character %q at byte %d", c, i)
		}
	}
	if ascii {
		return nil
	}
	if !utf8.ValidString(s) {
		return errors.New("id is not valid UTF-8")
	}
	for i, r := range s {
		if forbiddenRune(r) {
			return fmt.Errorf("id contains a forbidden character %U at byte %d", r, i)
		}
	}
	if !norm.NFC.IsNormalString(s) {
		return fmt.Errorf("id is not in Unicode normalization form NFC (%+q is %+q in NFC)", s, norm.NFC.String(s))
	}
	return nil
}

// forbiddenRune reports the non-ASCII runes an id may not hold: the
// invisible ones, spaces of any width and variation selectors.
func forbiddenRune(r rune) bool {
	return r == ',' || unicode.Is(unicode.Zs, r) || invisibleRune(r) ||
		(r >= 0xfe00 && r <= 0xfe0f) || (r >= 0xe0100 && r <= 0xe01ef) // variation selectors
}

// invisibleRune reports the characters that neither an id nor a status
// text may hold: controls (C0, DEL, C1), format characters (bidi
// embeddings, overrides, isolates and marks, zero-width space, joiner and
// non-joiner, word joiner, byte order mark, soft hyphen, tags…), line and
// paragraph separators, the fillers that render as nothing (U+034F,
// U+115F, U+1160, U+17B4, U+17B5, U+3164, U+FFA0), and U+FFFD, what
// invalid bytes decode to. (presence.js's idProblem and textProblem say
// the same.)
func invisibleRune(r rune) bool {
	switch r {
	case 0x034f, 0x115f, 0x1160, 0x17b4, 0x17b5, 0x3164, 0xffa0, utf8.RuneError:
		return true
	}
	return unicode.Is(unicode.Cc, r) || unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Zl, r) || unicode.Is(unicode.Zp, r)
}

// ValidateText reports whether s may be used as a status text: valid
// UTF-8, at most MaxTextLen characters, none of them invisible
// (invisibleRune) but a zero-width joiner inside an emoji sequence
// (👩‍💻: between two characters that are not letters or digits).
func ValidateText(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("status text is not valid UTF-8")
	}
	if n := utf8.RuneCountInString(s); n > MaxTextLen {
		return fmt.Errorf("status text is %d characters long, the limit is %d", n, MaxTextLen)
	}
	prev := rune(-1)
	for i, r := range s {
		if r == 0x200d && prev >= 0x80 && !unicode.IsLetter(prev) && !unicode.IsDigit(prev) {
			if next, _ := utf8.DecodeRuneInString(s[i+3:]); i+3 < len(s) && next >= 0x80 && !unicode.IsLetter(next) && !unicode.IsDigit(next) {
				prev = r
				continue
			}
		}
		if invisibleRune(r) {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
				return fmt.Errorf("status text contains a control character %U at byte %d", r, i)
			}
			return fmt.Errorf("status text contains an invisible character %U at byte %d (format, separator or filler)", r, i)
		}
		prev = r
	}
	return nil
}

// Visibility says who may see a piece of a user's presence.
type Visibility uint8

// Visibilities. The zero value is Everyone.
const (
	Everyone Visibility = iota
	Contacts            // only the users in the owner's contact list
	Nobody
)

var visibilityNames = [...]string{"everyone", "contacts", "nobody"}

// String returns the wire name of v.
func (v Visibility) String() string {
	if int(v) < len(visibilityNames) {
		return visibilityNames[v]
	}
	return fmt.Sprintf("visibility(%d)", uint8(v))
}

// ParseVisibility parses "everyone", "contacts" or "nobody".
func ParseVisibility(s string) (Visibility, error) {
	for i, n := range visibilityNames {
		if s == n {
			return Visibility(i), nil
		}
	}
	return 0, fmt.Errorf("unknown visibility %q: want one of everyone, contacts, nobody", s)
}

// Settings are a user's privacy settings. The zero value shows everything to
// everyone.
type Settings struct {
	Status   Visibility // who sees the status, status text and device count
	LastSeen Visibility // who sees last_seen
}

// Profile is the durable part of a user: what survives a restart and what is
// served for users who have not been seen for years. Times are Unix
// milliseconds; 0 means never.
type Profile struct {
	UserID      string
	Manual      Manual
	Text        string
	LastSeen    int64 // the user's true last heartbeat or activity
	PubLastSeen int64 // what everyone else sees (frozen while invisible)
	Version     uint64
	Settings    Settings
	// PubText and PubVersion are the status text and version everyone
	// else sees: those of the last change published to them. They differ
	// from Text and Version while the user is invisible and changed their
	// text since they vanished (User.SetStatus): what others see is frozen
	// then, text and version included, as last_seen is. PubVersion 0 means
	// a profile that does not say (a durable record of before, or one
	// whose public face is its own): PubText and PubVersion are then Text
	// and Version (Public).
	PubText    string
	PubVersion uint64
}

// Frozen reports whether a durable store must keep the public face
// (Public) beside the user's own text and version: it differs from them,
// or the user is invisible (and was ever changed) — their text may change
// under the face at any moment (SaveStatus), before the next checkpoint.
// Otherwise the face is Text and Version.
func (p *Profile) Frozen() bool {
	if p.Manual == ManualInvisible {
		return p.Version != 0 || p.PubVersion != 0
	}
	return p.PubVersion != 0 && (p.PubVersion != p.Version || p.PubText != p.Text)
}

// SaveStatus applies a status the user set (tracker.Durable.SaveStatus)
// to p, the user's durable record, as a durable store does in that same
// write: the manual status and text and the public face, so that nothing
// rebuilt from the record before the next checkpoint (a read while the
// state store is down, a reload, a restart after a crash) shows a text
// the user set while invisible. A status invisible keeps the face the
// record shows (Public), at version 1 at least so that it reads as a face
// (a version 0 would read as "the user's own"); the face a change to
// invisible publishes (a text set in the same breath by a user who was
// visible) comes with the next checkpoint. Any other status makes the
// user's own text their face: everyone sees it now.
func (p *Profile) SaveStatus(m Manual, text string) {
	if m == ManualInvisible {
		if p.PubVersion == 0 {
			p.PubText, p.PubVersion = p.Text, max(p.Version, 1)
		}
		p.Version = max(p.Version, 1)
	} else {
		p.PubText, p.PubVersion = "", 0
	}
	p.Manual, p.Text = m, text
}

// Checkpoint applies c, a checkpoint of the user (one profile of
// tracker.Durable.SaveLastSeen), to p, the user's durable record, as a
// durable store does: nothing if c advances none of last_seen, public
// last_seen and version; otherwise each of them forwards and, if c's
// version is at least p's, c's public face — kept (Public) where c is
// Frozen, none otherwise. A face of none does not replace the face of
// an invisible user's record: c was taken before the status that made
// them invisible was saved (SaveStatus), and "the user's own text" would
// be a text they set since.
func (p *Profile) Checkpoint(c *Profile) {
	if c.LastSeen <= p.LastSeen && c.PubLastSeen <= p.PubLastSeen && c.Version <= p.Version {
		return
	}
	if c.Version >= p.Version {
		switch {
		case c.Frozen():
			p.PubText, p.PubVersion = c.Public()
		case p.Manual != ManualInvisible:
			p.PubText, p.PubVersion = "", 0
		}
	}
	p.LastSeen = max(p.LastSeen, c.LastSeen)
	p.PubLastSeen = max(p.PubLastSeen, c.PubLastSeen)
	p.Version = max(p.Version, c.Version)
}

// Public returns the status text and version everyone else sees.
func (p *Profile) Public() (text string, version uint64) {
	if p.PubVersion == 0 {
		return p.Text, p.Version
	}
	return p.PubText, p.PubVersion
}

// Raise moves the version of a profile read from a durable store up by
// margin (a version 0, a user never changed, stays 0) and then to at
// least floor, and the public version along with it, keeping its
// distance below: the one rule of every load and cold read (Lua's
// load.lua follows it). PubText and PubVersion are then set, whatever
// they said before (Public).
func (p *Profile) Raise(margin, floor uint64) {
	p.PubText, p.PubVersion = p.Public()
	p.Version, p.PubVersion = raise(p.Version, p.PubVersion, margin, floor)
}

// raise returns version v raised by margin (unless 0) and then to at
// least floor, and public version pub moved along at its distance below
// v. A public version above the version (no store writes one) counts as
// the version: v is raised to it first, so that the distance is never
// negative and pub never reads as 0 ("the version": Public) but where v
// was.
func raise(v, pub, margin, floor uint64) (uint64, uint64) {
	v = max(v, pub)
	lag := v - pub
	if v > 0 {
		v += margin
	}
	v = max(v, floor)
	return v, v - lag
}

// Snapshot is the true state of one user at one moment, as read by the query
// path. It must go through the privacy filter before anyone but the user
// sees it.
type Snapshot struct {
	UserID      string
	Known       bool   // false: never seen and no durable record
	Status      Status // true status (Invisible included)
	Manual      Manual
	Text        string
	LastSeen    int64 // Unix ms, 0 = never
	PubLastSeen int64 // Unix ms, 0 = never
	Devices     int   // alive devices
	Version     uint64
	Settings    Settings
	// PubText and PubVersion are what everyone else sees of the text and
	// version (Profile.PubText); PubVersion 0: Text and Version (Public).
	PubText    string
	PubVersion uint64
}

// Public returns the status text and version everyone else sees.
func (s *Snapshot) Public() (text string, version uint64) {
	if s.PubVersion == 0 {
		return s.Text, s.Version
	}
	return s.PubText, s.PubVersion
}

// Raise is Profile.Raise of a snapshot read from a durable profile.
func (s *Snapshot) Raise(margin, floor uint64) {
	s.PubText, s.PubVersion = s.Public()
	s.Version, s.PubVersion = raise(s.Version, s.PubVersion, margin, floor)
}

// SnapshotFromProfile is the snapshot of a user with no live device.
func SnapshotFromProfile(p *Profile) Snapshot {
	s := Snapshot{
		UserID:      p.UserID,
		Known:       true,
		Status:      Offline,
		Manual:      p.Manual,
		Text:        p.Text,
		LastSeen:    p.LastSeen,
		PubLastSeen: p.PubLastSeen,
		Version:     p.Version,
		Settings:    p.Settings,
	}
	s.PubText, s.PubVersion = p.Public()
	return s
}

// Change is the outcome of applying one operation to a user. When Changed is
// true the user's visible presence (public status or status text) changed and
// an Event must be published.
type Change struct {
	Changed bool
	Event   Event
	// Rooms are the joins and leaves the operation caused, applied
	// already: the leaves of a device that ended, those of a user who
	// went invisible and the joins of one who came back. Nil for a user
	// in no room (no allocation on a beat's path).
	Rooms []RoomEvent
}

// Event is a change of a user's visible presence, as everyone but the user
// would see it with no privacy setting in the way. Version grows with every
// event of the user, so consumers can drop duplicates and stale replays.
type Event struct {
	UserID string
	Status Status // public status: never Invisible
	Prev   Status // public status before the change
	// Self is the status as the user themselves sees it (Invisible
	// included): what the user's own sockets are shown.
	Self Status
	// SelfOnly marks a change that only the user themselves may see: the
	// text of an invisible user (User.SetStatus). Status, Text and
	// LastSeen are the frozen public face, the version is new; nobody but
	// the user is sent it, and exits to other services leave it out (the
	// change stream marks it).
	SelfOnly bool
	// SettingsOnly marks a change of who may see the user, not of their
	// state (User.SetSettings): Status, Text and LastSeen are what was
	// published last, the version is new, and PrevSettings are the
	// settings before. An exit sends each watcher its new view only where
	// it differs from its view under PrevSettings (a null status where
	// sight was lost), and nothing to anyone else. Merge folds a later
	// event into one not yet sent.
	SettingsOnly    bool
	SettingsChanged bool // PrevSettings are set
	// Settings are the user's privacy settings when the change was made,
	// so every exit can filter the event without another look-up.
	Settings Settings
	// PrevSettings are the settings before the event when SettingsChanged
	// is set (Before reads them either way).
	PrevSettings Settings
	Text         string // public status text
	// SelfText is the status text as the user sees it: Text but while the
	// user is invisible, whose public text is frozen (SelfView).
	SelfText string
	LastSeen int64 // public last_seen, Unix ms
	Version  uint64
	At       int64 // Unix ms of the change
}

// SelfView returns the status and status text the user themselves is
// shown of ev: Self and SelfText where they may differ from the public
// face (an invisible user, a change only the user sees), otherwise
// Status and Text.
func (ev *Event) SelfView() (Status, string) {
	self := ev.Status
	if ev.Self.Public() == ev.Status {
		self = ev.Self // (an event that does not say, or contradicts itself, shows the public status)
	}
	if ev.SelfOnly || self == Invisible {
		return self, ev.SelfText
	}
	return self, ev.Text
}

// Before returns the settings watchers saw the user under before ev.
func (ev *Event) Before() Settings {
	if ev.SettingsChanged {
		return ev.PrevSettings
	}
	return ev.Settings
}

// Merge folds next, a later event of the same user, into ev, an event not
// delivered yet, so that delivering the result alone tells every watcher
// what delivering both would have: next's state and settings, the
// settings before ev, a state change if either changed the state.
// Neither may be a change only the user sees (SelfOnly): it carries a
// version nobody else may be sent.
func (ev *Event) Merge(next *Event) {
	before, changed, only := ev.Before(), ev.SettingsChanged || next.SettingsChanged, ev.SettingsOnly && next.SettingsOnly
	*ev = *next
	ev.PrevSettings, ev.SettingsChanged, ev.SettingsOnly = before, changed, only
}

package presence

import (
	"errors"
	"fmt"
)

// A room is a set of devices: a device is in a room from its join until
// its leave, its bye or its end (the close grace after its socket closed,
// or its ttl), so a reconnect within the grace shows nothing. A user is a
// member of a room while any of its devices is in it and the user is not
// invisible: going invisible is a leave from every room, coming back a
// join. Room ids follow the rules of user ids (ValidateID).

// RoomKind is what happened to a room's membership.
type RoomKind uint8

// Kinds of room events.
const (
	RoomJoin  RoomKind = iota + 1 // the user became a member
	RoomLeave                     // the user stopped being one
)

func (k RoomKind) String() string {
	switch k {
	case RoomJoin:
		return "join"
	case RoomLeave:
		return "leave"
	}
	return fmt.Sprintf("RoomKind(%d)", uint8(k))
}

// RoomReason is why a membership changed. Watchers are told the kind
// only; the reason goes to the API key's exits (the change stream,
// webhooks), as a user's true cause does.
type RoomReason uint8

// Reasons of room events.
const (
	ReasonJoined    RoomReason = iota + 1 // a device joined
	ReasonLeft                            // its last device in the room left
	ReasonBye                             // its last device in the room said bye
	ReasonEnded                           // its last device in the room ended (close grace, ttl)
	ReasonInvisible                       // the user went invisible
	ReasonVisible                         // the user came back from invisible
)

func (r RoomReason) String() string {
	switch r {
	case ReasonJoined:
		return "joined"
	case ReasonLeft:
		return "left"
	case ReasonBye:
		return "bye"
	case ReasonEnded:
		return "ended"
	case ReasonInvisible:
		return "invisible"
	case ReasonVisible:
		return "visible"
	}
	return fmt.Sprintf("RoomReason(%d)", uint8(r))
}

// RoomEvent is one join or leave of a room's member. Count is the
// room's members after it; Version grows with every event of the room,
// so watchers drop duplicates and stale replays as they do users'.
type RoomEvent struct {
	Room    string
	UserID  string
	Kind    RoomKind
	Reason  RoomReason
	Count   int
	Version uint64
	At      int64 // Unix ms
	// Status and Settings are the member's public status and privacy
	// settings at a join, so each watcher is shown the status its
	// relation allows without another read (zero for a leave).
	Status   Status
	Settings Settings
}

// RoomMember reports whether u counts as a member of the rooms its
// devices are in: it is not invisible. (A user whose every device ended
// is in no room.) Every store applies this one rule.
func (u *User) RoomMember() bool { return u.Pub != Offline }

// RoomRules are the limits of rooms. The zero value takes the defaults.
type RoomRules struct {
	// MaxRooms caps the rooms one device is in at once; a join of one
	// more is refused with ErrTooManyRooms.
	MaxRooms int
}

// DefaultMaxRooms is the default cap of rooms per device.
const DefaultMaxRooms = 100

// MaxMaxRooms is the largest cap of rooms per device a node takes: a
// device's rooms are counted in 16 bits where they are stored.
const MaxMaxRooms = 10000

// WithDefaults returns r with its zero (or negative) fields set to the
// defaults.
func (r RoomRules) WithDefaults() RoomRules {
	if r.MaxRooms <= 0 {
		r.MaxRooms = DefaultMaxRooms
	}
	return r
}

// Errors of room operations.
var (
	// ErrTooManyRooms refuses a join beyond RoomRules.MaxRooms; nothing
	// is joined.
	ErrTooManyRooms = errors.New("the device is in as many rooms as it may be")
	// ErrDeviceNotAlive refuses a join of a device the store does not
	// hold alive: a device joins rooms after its first beat.
	ErrDeviceNotAlive = errors.New("the device is not alive: it joins rooms after its first heartbeat or connect")
)

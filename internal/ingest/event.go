package ingest

import (
	"errors"
	"fmt"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/strictjson"
)

// MaxMessageSize bounds the payload of one event message, in bytes. A larger
// message is invalid and terminated.
const MaxMessageSize = 4 << 10

// Event types, the values of the "type" field.
const (
	TypeConnected    = "session_connected"
	TypeHeartbeat    = "heartbeat"
	TypeDisconnected = "session_disconnected"
)

// Event is one valid session event, as Decode returns it. Every transport
// of session events (JetStream here, Kafka in package kafka) applies the
// same events by the same rules.
type Event struct {
	// Bye is true for session_disconnected; false for session_connected
	// and heartbeat, which both keep the device alive.
	Bye bool
	// Connect is true for session_connected: a new session of the
	// device, which a node that owns its devices claims again whatever
	// it knew of it (Connector).
	Connect bool
	User    string
	Device  string
	At      time.Time // when it happened at the connection layer
	Active  bool      // a beat that is user activity (default true)
}

// rawEvent is the JSON form of a message, read by the rule of every
// input of the node (package strictjson): a key given twice, a key that
// differs from a field's name only in case, or invalid UTF-8 is refused.
// Other keys are ignored, so the connection layer may add fields of its
// own.
type rawEvent struct {
	Type   string `json:"type"`
	User   string `json:"user_id"`
	Device string `json:"device_id"`
	At     string `json:"at"`
	Active *bool  `json:"active"`
}

// ErrInvalid marks a message that can never be applied.
var ErrInvalid = errors.New("invalid event")

// Decode parses and validates one message payload against now. maxSkew
// bounds how far in the future `at` may be. Every error wraps ErrInvalid.
func Decode(data []byte, now time.Time, maxSkew time.Duration) (Event, error) {
	if len(data) > MaxMessageSize {
		return Event{}, fmt.Errorf("%w: %d bytes, the limit is %d", ErrInvalid, len(data), MaxMessageSize)
	}
	var r rawEvent
	if err := strictjson.DecodeOpen(data, &r); err != nil {
		return Event{}, fmt.Errorf("%w: event %v", ErrInvalid, err)
	}
	var ev Event
	switch r.Type {
	case TypeConnected:
		ev.Connect = true
	case TypeHeartbeat:
	case TypeDisconnected:
		ev.Bye = true
	case "":
		return Event{}, fmt.Errorf("%w: no type", ErrInvalid)
	default:
		return Event{}, fmt.Errorf("%w: unknown type %.64q: want %s, %s or %s", ErrInvalid, r.Type, TypeConnected, TypeHeartbeat, TypeDisconnected)
	}
	if err := presence.ValidateID(r.User); err != nil {
		return Event{}, fmt.Errorf("%w: user_id: %v", ErrInvalid, err)
	}
	if err := presence.ValidateID(r.Device); err != nil {
		return Event{}, fmt.Errorf("%w: device_id: %v", ErrInvalid, err)
	}
	if r.At == "" {
		return Event{}, fmt.Errorf("%w: no at", ErrInvalid)
	}
	// RFC 3339 with any number of fractional digits (wire.TimeLayout, with
	// exactly three, is what we recommend).
	at, err := time.Parse(time.RFC3339Nano, r.At)
	if err != nil {
		return Event{}, fmt.Errorf("%w: at %.64q is not an RFC 3339 time", ErrInvalid, r.At)
	}
	if at.After(now.Add(maxSkew)) {
		return Event{}, fmt.Errorf("%w: at %s is %v in the future (allowed skew %v)", ErrInvalid, r.At, at.Sub(now).Round(time.Millisecond), maxSkew)
	}
	ev.User, ev.Device, ev.At = r.User, r.Device, at
	ev.Active = r.Active == nil || *r.Active
	return ev, nil
}

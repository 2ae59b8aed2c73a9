package ingest

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/presenced/presenced/internal/presence"
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

// kind is a decoded event type.
type kind uint8

const (
	kindBeat kind = iota + 1 // session_connected or heartbeat
	kindBye                  // session_disconnected
)

// event is one validated message.
type event struct {
	kind   kind
	user   string
	device string
	at     time.Time
	active bool
}

// rawEvent is the JSON form of a message. Unknown fields are ignored, so
// the connection layer may add fields of its own.
type rawEvent struct {
	Type   string `json:"type"`
	User   string `json:"user_id"`
	Device string `json:"device_id"`
	At     string `json:"at"`
	Active *bool  `json:"active"`
}

// errInvalid marks a message that can never be applied.
var errInvalid = errors.New("invalid event")

// decode parses and validates one message payload against now. maxSkew
// bounds how far in the future `at` may be. Every error wraps errInvalid.
func decode(data []byte, now time.Time, maxSkew time.Duration) (event, error) {
	if len(data) > MaxMessageSize {
		return event{}, fmt.Errorf("%w: %d bytes, the limit is %d", errInvalid, len(data), MaxMessageSize)
	}
	var r rawEvent
	if err := json.Unmarshal(data, &r); err != nil {
		return event{}, fmt.Errorf("%w: not a JSON object: %v", errInvalid, err)
	}
	var ev event
	switch r.Type {
	case TypeConnected, TypeHeartbeat:
		ev.kind = kindBeat
	case TypeDisconnected:
		ev.kind = kindBye
	case "":
		return event{}, fmt.Errorf("%w: no type", errInvalid)
	default:
		return event{}, fmt.Errorf("%w: unknown type %.64q: want %s, %s or %s", errInvalid, r.Type, TypeConnected, TypeHeartbeat, TypeDisconnected)
	}
	if err := presence.ValidateID(r.User); err != nil {
		return event{}, fmt.Errorf("%w: user_id: %v", errInvalid, err)
	}
	if err := presence.ValidateID(r.Device); err != nil {
		return event{}, fmt.Errorf("%w: device_id: %v", errInvalid, err)
	}
	if r.At == "" {
		return event{}, fmt.Errorf("%w: no at", errInvalid)
	}
	// RFC 3339 with any number of fractional digits (wire.TimeLayout, with
	// exactly three, is what we recommend).
	at, err := time.Parse(time.RFC3339Nano, r.At)
	if err != nil {
		return event{}, fmt.Errorf("%w: at %.64q is not an RFC 3339 time", errInvalid, r.At)
	}
	if at.After(now.Add(maxSkew)) {
		return event{}, fmt.Errorf("%w: at %s is %v in the future (allowed skew %v)", errInvalid, r.At, at.Sub(now).Round(time.Millisecond), maxSkew)
	}
	ev.user, ev.device, ev.at = r.User, r.Device, at
	ev.active = r.Active == nil || *r.Active
	return ev, nil
}

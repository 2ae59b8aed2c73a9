package wire

import (
	"strconv"
	"time"

	"github.com/presenced/presenced/internal/privacy"
)

// The server → client messages of the WebSocket protocol. Each is one JSON
// object with a "type"; none ends with a newline (one message is one text
// frame).

// appendState appends the fields a watcher sees of one user, shared by
// presence and snapshot messages:
// "status":…,"last_seen":…,"status_text":…,"version":…
func appendState(b []byte, v *privacy.View) []byte {
	b = append(b, `"status":`...)
	b = AppendStatus(b, v)
	b = append(b, `,"last_seen":`...)
	b = AppendLastSeen(b, v)
	b = append(b, `,"status_text":`...)
	b = AppendText(b, v)
	b = append(b, `,"version":`...)
	return AppendVersion(b, v)
}

// AppendPresence appends the live change message of one user:
// {"type":"presence","user_id":…,"status":…,"last_seen":…,"status_text":…,"version":…}.
// The fan-out sends it for views whose status is visible, and once to a
// watcher who just lost sight of the status (a privacy change: status,
// last_seen and text null, the version new); a hidden field encodes as
// null, so the message is always well-formed.
func AppendPresence(b []byte, v *privacy.View) []byte {
	b = append(b, `{"type":"presence","user_id":`...)
	b = AppendString(b, v.UserID)
	b = append(b, ',')
	b = appendState(b, v)
	return append(b, '}')
}

// AppendSnapshot appends the answer to a subscribe, keyed by user id in the
// order of views: {"type":"snapshot","users":{"2":{"status":…,"last_seen":…,
// "status_text":…,"version":…},…}}. A hidden status reads null (and so do
// its text and version); a hidden or never-set last_seen reads null. The
// caller passes each user once.
func AppendSnapshot(b []byte, views []privacy.View) []byte {
	b, _ = appendSnapshot(b, views, nil)
	return append(b, '}')
}

// AppendSnapshotKnown appends the snapshot that answers a subscribe with
// known versions: the views but those for which skip is true, and
// "unchanged", the number skipped, which it also returns.
func AppendSnapshotKnown(b []byte, views []privacy.View, skip func(*privacy.View) bool) ([]byte, int) {
	b, skipped := appendSnapshot(b, views, skip)
	b = append(b, `,"unchanged":`...)
	b = strconv.AppendInt(b, int64(skipped), 10)
	return append(b, '}'), skipped
}

// appendSnapshot appends a snapshot of views but those skip leaves out
// (skip nil: none) without its closing brace, and the number left out.
func appendSnapshot(b []byte, views []privacy.View, skip func(*privacy.View) bool) ([]byte, int) {
	b = append(b, `{"type":"snapshot","users":{`...)
	skipped := 0
	for i := range views {
		if skip != nil && skip(&views[i]) {
			skipped++
			continue
		}
		if i > skipped {
			b = append(b, ',')
		}
		b = AppendString(b, views[i].UserID)
		b = append(b, `:{`...)
		b = appendState(b, &views[i])
		b = append(b, '}')
	}
	return append(b, '}'), skipped
}

// AppendError appends {"type":"error","code":…,"message":…}.
func AppendError(b []byte, code, message string) []byte {
	return AppendRoomError(b, code, "", "", message)
}

// AppendRoomError appends the error of a room message,
// {"type":"error","code":…,"request":…,"room":…,"message":…}: request is
// the type of the message refused (join, leave, watch_room or
// unwatch_room) and room the room it named, so that a client knows
// exactly which of its messages about the room was refused. An empty room
// leaves both out (AppendError). The caller passes only a valid room id
// and a type of room message, never what a client sent unchecked.
func AppendRoomError(b []byte, code, request, room, message string) []byte {
	b = append(b, `{"type":"error","code":`...)
	b = AppendString(b, code)
	if room != "" {
		b = append(b, `,"request":`...)
		b = AppendString(b, request)
		b = append(b, `,"room":`...)
		b = AppendString(b, room)
	}
	b = append(b, `,"message":`...)
	b = AppendString(b, message)
	return append(b, '}')
}

// AppendWelcome appends the first message of a connection:
// {"type":"welcome","user_id":…,"device_id":…,"heartbeat_interval_ms":…,"ttl_ms":…,"close_grace_ms":…}.
// Durations are sent in whole milliseconds.
func AppendWelcome(b []byte, userID, deviceID string, heartbeatInterval, ttl, closeGrace time.Duration) []byte {
	b = append(b, `{"type":"welcome","user_id":`...)
	b = AppendString(b, userID)
	b = append(b, `,"device_id":`...)
	b = AppendString(b, deviceID)
	b = append(b, `,"heartbeat_interval_ms":`...)
	b = strconv.AppendInt(b, heartbeatInterval.Milliseconds(), 10)
	b = append(b, `,"ttl_ms":`...)
	b = strconv.AppendInt(b, ttl.Milliseconds(), 10)
	b = append(b, `,"close_grace_ms":`...)
	b = strconv.AppendInt(b, closeGrace.Milliseconds(), 10)
	return append(b, `,"subscribe_known":true}`...)
}

package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Messages the client sends (docs/protocol.md, "Client → server").
type (
	typeMsg struct {
		Type string `json:"type"`
	}
	heartbeatMsg struct {
		Type   string `json:"type"`
		Active *bool  `json:"active,omitempty"`
	}
	setStatusMsg struct {
		Type   string  `json:"type"`
		Status string  `json:"status"`
		Text   *string `json:"text,omitempty"`
	}
	subscribeMsg struct {
		Type    string   `json:"type"`
		UserIDs []string `json:"user_ids"`
		// Known is the version last delivered of some of UserIDs, sent
		// again after a reconnect to a server that takes it: the
		// snapshot then leaves out those whose view is still that one.
		Known map[string]uint64 `json:"known,omitempty"`
	}
	roomMsg struct {
		Type string `json:"type"`
		Room string `json:"room"`
	}
)

// serverMsg is any message the server sends; Type says which fields count.
type serverMsg struct {
	Type string `json:"type"`

	// welcome
	UserID              string `json:"user_id"`
	DeviceID            string `json:"device_id"`
	HeartbeatIntervalMS int64  `json:"heartbeat_interval_ms"`
	TTLMS               int64  `json:"ttl_ms"`
	CloseGraceMS        int64  `json:"close_grace_ms"`
	SubscribeKnown      bool   `json:"subscribe_known"`

	// snapshot
	Users map[string]wirePresence `json:"users"`

	// presence (with UserID)
	wirePresence

	// room, room_change and room_interval (with UserID, and Status and
	// Version of wirePresence)
	Room       string             `json:"room"`
	Mode       string             `json:"mode"`
	Count      int                `json:"count"`
	Members    map[string]*string `json:"members"`
	Next       *string            `json:"next"`
	Event      string             `json:"event"`
	Joined     []string           `json:"joined"`
	Left       []string           `json:"left"`
	MoreJoined int                `json:"more_joined"`
	MoreLeft   int                `json:"more_left"`

	// error (with Room)
	Code    string `json:"code"`
	Message string `json:"message"`
	Request string `json:"request"`
}

type wirePresence struct {
	Status     *string    `json:"status"`
	LastSeen   *time.Time `json:"last_seen"`
	StatusText *string    `json:"status_text"`
	Version    uint64     `json:"version"`
}

func (p wirePresence) event(userID string, snapshot bool) Event {
	ev := Event{UserID: userID, StatusText: p.StatusText, Version: p.Version, Snapshot: snapshot}
	if p.Status != nil {
		ev.Status = Status(*p.Status)
	}
	if p.LastSeen != nil {
		ev.LastSeen = *p.LastSeen
	}
	return ev
}

// decode reads one server message. Unknown fields are ignored, so a newer
// server can add some.
func decode(data []byte) (*serverMsg, error) {
	var m serverMsg
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("decode server message: %w", err)
	}
	if m.Type == "" {
		return nil, errors.New("decode server message: no type")
	}
	return &m, nil
}

// Update is one thing the client tells the application on Updates: an
// Event, a RoomSnapshot, a RoomChange, a RoomInterval, a StateChange or a
// *ServerError.
type Update interface{ isUpdate() }

// Event is the presence of one watched user as this viewer may see it.
type Event struct {
	UserID string
	// Status is Hidden when the viewer may not see it: in a snapshot, or in
	// the one live Event sent when the user's contact list or settings
	// took the viewer's sight away (no change of a hidden status is sent).
	// The user's own status is the true one (Invisible included).
	Status Status
	// LastSeen is zero when the viewer may not see it.
	LastSeen time.Time
	// StatusText is the manual status's text; nil when there is none.
	StatusText *string
	// Version grows with every change of the user; the client delivers an
	// Event only when it is above the last one delivered for that user.
	Version uint64
	// Snapshot is set for the state sent on subscribing (and again after a
	// reconnect, if it changed meanwhile), clear for a live change.
	Snapshot bool
}

// StateChange reports the connection: Connected (also after a reconnect),
// Disconnected with the cause (the client is reconnecting), Closed last.
type StateChange struct {
	State State
	// Err is why the connection ended (Disconnected) or why the client gave
	// up (Closed after a refusal; nil after Close or Bye).
	Err error
}

// State is the state of the connection.
type State uint8

// States of a Client.
const (
	Disconnected State = iota // reconnecting
	Connected
	Closed // for good
)

func (s State) String() string {
	switch s {
	case Disconnected:
		return "disconnected"
	case Connected:
		return "connected"
	case Closed:
		return "closed"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// ServerError is an error message of the server, e.g. code
// "too_many_subscriptions", "rate_limited" or "invalid_request". The
// connection stays up.
//
// Room names the room of a refused join, leave, WatchRoom or UnwatchRoom,
// and Request the message refused: "join", "leave", "watch_room" or
// "unwatch_room" (both empty for other errors). The client has acted on
// exactly that message before the error reaches the application. One
// refused with a code a retry can cure (unavailable, rate_limited,
// device_not_alive) is sent again after a backoff, until it succeeds, the
// application asks otherwise (a Join after a refused Leave, an UnwatchRoom
// after a refused WatchRoom, …: its own message supersedes the retry), or
// the connection ends — a reconnect joins and watches again anyway, and
// sends a leave still due. A join or watch refused for good
// (room_not_allowed, too_many_rooms, too_many_watched_rooms,
// rooms_unavailable, internal, …) is no longer joined or watched
// (JoinedRooms, WatchedRooms): Join or WatchRoom it again to try once
// more; the other one of the room stays as it was.
//
// An error that names only the room (no Request) makes the client
// guess the message by the code — a retry sends the room's join and
// watch still wanted again, and a code that both a join and a watch may
// get drops both, the watch only if its room message had not come yet.
type ServerError struct {
	Code    string
	Message string
	Room    string
	Request string
}

func (e *ServerError) Error() string { return "presenced: " + e.Code + ": " + e.Message }

// HandshakeError is a refused upgrade: the HTTP status and the server's
// error body. 400, 401, 403 and 404 stop the client (retrying cannot cure
// them); other statuses are retried.
type HandshakeError struct {
	StatusCode int
	Code       string
	Message    string
}

func (e *HandshakeError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("presenced refused the connection: HTTP %d", e.StatusCode)
	}
	return fmt.Sprintf("presenced refused the connection: HTTP %d %s: %s", e.StatusCode, e.Code, e.Message)
}

// CloseError is a connection closed by the server with a close frame, e.g.
// 1001 (shutting down), 4001 (idle), 4002 (slow consumer) or
// CloseTokenExpired.
type CloseError struct {
	Code   int
	Reason string
}

// CloseTokenExpired is the close code of a connection whose token expired
// (docs/protocol.md). The server keeps the device for its close grace: with
// Config.TokenFunc the client reconnects with a fresh token (after its
// first backoff step), as the same device, and nobody watching sees a
// change; without it the client
// stops, its Err the *CloseError.
const CloseTokenExpired = 4003

func (e *CloseError) Error() string {
	return fmt.Sprintf("presenced closed the connection: %d %s", e.Code, e.Reason)
}

func (Event) isUpdate()        {}
func (StateChange) isUpdate()  {}
func (*ServerError) isUpdate() {}

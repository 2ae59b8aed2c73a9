package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/strictjson"
)

// Kinds of client messages.
const (
	msgHeartbeat = iota + 1
	msgSetStatus
	msgSubscribe
	msgUnsubscribe
	msgBye
	msgJoin
	msgLeave
	msgWatchRoom
	msgUnwatchRoom
)

// clientMsg is a decoded, validated client message.
type clientMsg struct {
	kind    int
	active  bool              // heartbeat
	manual  presence.Manual   // set_status
	text    string            // set_status
	userIDs []string          // subscribe, unsubscribe: valid and distinct
	known   map[string]uint64 // subscribe: the version the client holds of some of userIDs
	room    string            // join, leave, watch_room, unwatch_room: a valid id
}

// protoError is a recoverable error answered with an error message.
type protoError struct {
	code, message string
	// room is the room a refused room message named, when it was a valid
	// id, and request the message's type: the error frame names both
	// (docs/protocol.md "Rooms").
	request, room string
}

func perr(code, format string, args ...any) *protoError {
	return &protoError{code: code, message: fmt.Sprintf(format, args...)}
}

// rawMsg is the union of the fields of every client message; which ones a
// type allows is checked after decoding.
type rawMsg struct {
	Type    *string         `json:"type"`
	Active  json.RawMessage `json:"active"`
	Status  json.RawMessage `json:"status"`
	Text    json.RawMessage `json:"text"`
	UserIDs json.RawMessage `json:"user_ids"`
	Known   json.RawMessage `json:"known"`
	Room    json.RawMessage `json:"room"`
}

// The heartbeats of our clients, as they write them.
var (
	beatActive     = []byte(`{"type":"heartbeat"}`)
	beatActiveTrue = []byte(`{"type":"heartbeat","active":true}`)
	beatInactive   = []byte(`{"type":"heartbeat","active":false}`)
)

// beatKind tells our clients' heartbeats apart without decoding: 1 for an
// active one, 2 for a background one, 0 for anything else.
func beatKind(b []byte) uint8 {
	switch {
	case bytes.Equal(b, beatActive), bytes.Equal(b, beatActiveTrue):
		return 1
	case bytes.Equal(b, beatInactive):
		return 2
	}
	return 0
}

// beatMessage is the heartbeat of kind k (beatKind, not 0).
func beatMessage(k uint8) clientMsg { return clientMsg{kind: msgHeartbeat, active: k == 1} }

// decodeClientMessage decodes one client message strictly: exactly one
// JSON object by the rule of package strictjson, a known type, only that
// type's fields, valid values. It is a pure function of the bytes.
func decodeClientMessage(b []byte) (clientMsg, *protoError) {
	// The heartbeats of the clients we ship, byte for byte, skip the JSON
	// decoder: they are nearly every message a server reads.
	if k := beatKind(b); k != 0 {
		return beatMessage(k), nil
	}
	return decodeJSONMessage(b)
}

// decodeJSONMessage is decodeClientMessage by the JSON decoder.
func decodeJSONMessage(b []byte) (clientMsg, *protoError) {
	var m clientMsg
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return m, perr("invalid_json", "a message is one JSON object with a type")
	}
	// The rule of every edge (HTTP bodies too): exact field names, each
	// once — {"type":"heartbeat","type":"bye"} or a "Status" beside
	// "status" is refused, not read as encoding/json would.
	var r rawMsg
	if err := strictjson.Decode(b, &r); err != nil {
		return m, perr("invalid_json", "message %v", err)
	}
	if r.Type == nil {
		return m, perr("unknown_type", "type is required: %s", knownTypes)
	}
	allowed := func(fields ...string) *protoError {
		present := map[string]bool{
			"active":   r.Active != nil,
			"status":   r.Status != nil,
			"text":     r.Text != nil,
			"user_ids": r.UserIDs != nil,
			"known":    r.Known != nil,
			"room":     r.Room != nil,
		}
		for _, f := range fields {
			delete(present, f)
		}
		for f, ok := range present {
			if ok {
				return perr("invalid_json", "a %s message has no field %q", *r.Type, f)
			}
		}
		return nil
	}
	switch *r.Type {
	case "heartbeat":
		if e := allowed("active"); e != nil {
			return m, e
		}
		m.kind, m.active = msgHeartbeat, true
		if r.Active != nil && !isNull(r.Active) {
			if err := json.Unmarshal(r.Active, &m.active); err != nil {
				return m, perr("invalid_json", "active must be true or false")
			}
		}
	case "set_status":
		if e := allowed("status", "text"); e != nil {
			return m, e
		}
		m.kind = msgSetStatus
		var s string
		if r.Status == nil || isNull(r.Status) || json.Unmarshal(r.Status, &s) != nil || s == "" {
			return m, perr("invalid_status", "status is required: one of online, away, busy, invisible")
		}
		man, err := presence.ParseManual(s)
		if err != nil {
			return m, perr("invalid_status", "status %q: %v", s, err)
		}
		m.manual = man
		if r.Text != nil && !isNull(r.Text) {
			if err := json.Unmarshal(r.Text, &m.text); err != nil {
				return m, perr("invalid_text", "text must be a string")
			}
			if err := presence.ValidateText(m.text); err != nil {
				return m, perr("invalid_text", "text: %v", err)
			}
		}
	case "subscribe", "unsubscribe":
		fields := []string{"user_ids"}
		if *r.Type == "subscribe" {
			fields = append(fields, "known")
		}
		if e := allowed(fields...); e != nil {
			return m, e
		}
		m.kind = msgSubscribe
		if *r.Type == "unsubscribe" {
			m.kind = msgUnsubscribe
		}
		var ids []string
		if r.UserIDs == nil || isNull(r.UserIDs) || json.Unmarshal(r.UserIDs, &ids) != nil {
			return m, perr("invalid_id", "user_ids must be a list of user ids")
		}
		if len(ids) == 0 {
			return m, perr("invalid_id", "user_ids is empty")
		}
		seen := make(map[string]struct{}, len(ids))
		out := ids[:0]
		for i, id := range ids {
			if err := presence.ValidateID(id); err != nil {
				return m, perr("invalid_id", "user_ids[%d]: %v", i, err)
			}
			if _, dup := seen[id]; dup {
				continue
			}
			seen[id] = struct{}{}
			out = append(out, id)
		}
		m.userIDs = out
		if r.Known != nil && !isNull(r.Known) {
			known, e := decodeKnown(r.Known, seen)
			if e != nil {
				return m, e
			}
			m.known = known
		}
	case "bye":
		if e := allowed(); e != nil {
			return m, e
		}
		m.kind = msgBye
	case "join", "leave", "watch_room", "unwatch_room":
		m.kind = roomKinds[*r.Type]
		// The room first, so that an error of the message can name it —
		// only a valid one: what fails the rules of ids is never echoed.
		room, e := decodeRoom(r.Room)
		if e := allowed("room"); e != nil {
			e.request, e.room = *r.Type, room
			return m, e
		}
		if e != nil {
			return m, e
		}
		m.room = room
	default:
		return m, perr("unknown_type", "unknown message type %q: want %s", *r.Type, knownTypes)
	}
	return m, nil
}

// decodeRoom reads the room field of a room message: a valid room id, or
// "" and the error.
func decodeRoom(raw json.RawMessage) (string, *protoError) {
	if raw == nil || isNull(raw) {
		return "", perr("invalid_id", "room is required: the id of a room")
	}
	var room string
	if err := json.Unmarshal(raw, &room); err != nil {
		return "", perr("invalid_id", "room must be a string: the id of a room")
	}
	if err := presence.ValidateID(room); err != nil {
		return "", perr("invalid_id", "room: %v", err)
	}
	return room, nil
}

// maxPeek bounds the messages refused unread (too many messages) whose
// room roomOf looks for: a room message is well below it, even with its
// id written in escapes.
const maxPeek = 512

// roomOf returns the type of a message refused before it was read and the
// room it names, if it is a room message with a valid room; "" and ""
// otherwise. Only short text messages are looked at, so a client pushing
// past the limit of messages costs little more than before.
func roomOf(op ws.OpCode, b []byte) (request, room string) {
	if op != ws.OpText || len(b) > maxPeek || !bytes.Contains(b, []byte(`"room"`)) {
		return "", ""
	}
	m, e := decodeJSONMessage(b)
	if e != nil {
		return e.request, e.room
	}
	if m.room == "" {
		return "", ""
	}
	return roomTypes[m.kind], m.room
}

// knownTypes lists the types of client messages, for error messages.
const knownTypes = "heartbeat, set_status, subscribe, unsubscribe, bye, join, leave, watch_room or unwatch_room"

// roomKinds are the kinds of the messages about one room, by type.
var roomKinds = map[string]int{"join": msgJoin, "leave": msgLeave, "watch_room": msgWatchRoom, "unwatch_room": msgUnwatchRoom}

// roomTypes are the types of the messages about one room, by kind.
var roomTypes = map[int]string{msgJoin: "join", msgLeave: "leave", msgWatchRoom: "watch_room", msgUnwatchRoom: "unwatch_room"}

func isNull(b json.RawMessage) bool { return string(bytes.TrimSpace(b)) == "null" }

// decodeKnown decodes the known field of a subscribe: an object of user
// ids of the message's user_ids (ids), each at most once, and the version
// the client holds of each, an integer from 0 to 2^64-1.
func decodeKnown(raw json.RawMessage, ids map[string]struct{}) (map[string]uint64, *protoError) {
	bad := perr("invalid_known", "known must be an object of user ids and versions (non-negative integers)")
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return nil, bad
	}
	known := make(map[string]uint64)
	for d.More() {
		t, err := d.Token()
		if err != nil {
			return nil, bad
		}
		id, _ := t.(string)
		if _, ok := ids[id]; !ok {
			return nil, perr("invalid_known", "known names %q, which user_ids does not", id)
		}
		if _, dup := known[id]; dup {
			return nil, perr("invalid_known", "known names %q twice", id)
		}
		if t, err = d.Token(); err != nil {
			return nil, bad
		}
		n, ok := t.(json.Number)
		if !ok {
			return nil, bad
		}
		v, err := strconv.ParseUint(string(n), 10, 64)
		if err != nil {
			return nil, bad
		}
		known[id] = v
	}
	return known, nil
}

package natsbus

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/wire"
)

// subjectOf returns prefix + base64url(user): one token whatever the id holds.
func subjectOf(prefix, user string) string {
	b := make([]byte, len(prefix)+base64.RawURLEncoding.EncodedLen(len(user)))
	copy(b, prefix)
	base64.RawURLEncoding.Encode(b[len(prefix):], []byte(user))
	return string(b)
}

// roomToken is the token after the prefix that starts the subjects of
// rooms: prefix + "r." + base64url(room). A user's subject is the prefix
// and one token, the base64url of a non-empty id (at least two
// characters, never a '.'), so it is never a room's (two tokens) and no
// user's token is "r".
const roomToken = "r"

// roomSubjectOf returns prefix + "r." + base64url(room).
func roomSubjectOf(prefix, room string) string {
	return subjectOf(prefix+roomToken+".", room)
}

// isSubjectOf reports whether subject is subjectOf(prefix, user), without
// allocating.
func isSubjectOf(subject, prefix, user string) bool {
	enc := base64.RawURLEncoding
	if len(subject) != len(prefix)+enc.EncodedLen(len(user)) || subject[:len(prefix)] != prefix {
		return false
	}
	var buf [128]byte
	rest := subject[len(prefix):]
	for len(user) > 0 {
		n := min(len(user), 48) // 48 bytes encode to 64 characters, no padding inside
		enc.Encode(buf[:], []byte(user[:n]))
		m := enc.EncodedLen(n)
		if string(buf[:m]) != rest[:m] {
			return false
		}
		user, rest = user[n:], rest[m:]
	}
	return true
}

// msgID is the Nats-Msg-Id of an event: "<user>:<version>" (the version is
// after the last colon, so ids holding colons stay unambiguous).
func msgID(user string, version uint64) string {
	return user + ":" + strconv.FormatUint(version, 10)
}

// roomMsgID is the Nats-Msg-Id of a room event: "r,<room>:<version>". A
// user's is "<user>:<version>", and ids may hold ':' but never ',': with
// "r:<room>:<version>" the user "r:doc" would share its ids with the room
// "doc", and the stream would drop one of two events as the other's
// duplicate.
func roomMsgID(room string, version uint64) string {
	return roomToken + "," + room + ":" + strconv.FormatUint(version, 10)
}

// appendEvent appends the JSON payload of ev (wire.AppendChange: the same
// message webhooks and Kafka carry).
func appendEvent(b []byte, ev *presence.Event) []byte { return wire.AppendChange(b, ev) }

// settings is the JSON of a user's privacy settings.
type settings struct {
	Status   string `json:"status"`
	LastSeen string `json:"last_seen"`
}

func (s *settings) parse(out *presence.Settings) (err error) {
	if out.Status, err = presence.ParseVisibility(s.Status); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	if out.LastSeen, err = presence.ParseVisibility(s.LastSeen); err != nil {
		return fmt.Errorf("last_seen: %w", err)
	}
	return nil
}

// payload is the decoded JSON of a message.
type payload struct {
	UserID       *string   `json:"user_id"`
	Status       string    `json:"status"`
	Prev         string    `json:"prev"`
	Text         string    `json:"text"`
	LastSeen     *string   `json:"last_seen"`
	Version      uint64    `json:"version"`
	At           string    `json:"at"`
	Settings     settings  `json:"settings"`
	SelfStatus   *string   `json:"self_status"`
	SelfText     *string   `json:"self_text"`
	SelfOnly     bool      `json:"self_only"`
	PrevSettings *settings `json:"prev_settings"`
	SettingsOnly bool      `json:"settings_only"`
}

// decodeEvent parses a payload into ev. Anything missing or malformed is an
// error; ev is then undefined.
func decodeEvent(data []byte, ev *presence.Event) error {
	var p payload
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	if p.UserID == nil || *p.UserID == "" {
		return errors.New("no user_id")
	}
	var err error
	*ev = presence.Event{UserID: *p.UserID, Text: p.Text, Version: p.Version}
	if ev.Status, err = parseStatus(p.Status); err != nil {
		return err
	}
	if ev.Prev, err = parseStatus(p.Prev); err != nil {
		return err
	}
	if p.LastSeen != nil {
		if ev.LastSeen, err = parseTime(*p.LastSeen); err != nil {
			return fmt.Errorf("last_seen: %w", err)
		}
	}
	if ev.At, err = parseTime(p.At); err != nil {
		return fmt.Errorf("at: %w", err)
	}
	if err = p.Settings.parse(&ev.Settings); err != nil {
		return fmt.Errorf("settings.%w", err)
	}
	ev.Self = ev.Status
	if p.SelfStatus != nil {
		if ev.Self, err = parseSelf(*p.SelfStatus); err != nil || ev.Self.Public() != ev.Status {
			return fmt.Errorf("self_status %q does not go with status %q", *p.SelfStatus, p.Status)
		}
	}
	ev.SelfText, ev.SelfOnly = ev.Text, p.SelfOnly
	if p.SelfText != nil {
		ev.SelfText = *p.SelfText
	}
	if p.PrevSettings != nil {
		ev.SettingsChanged = true
		if err = p.PrevSettings.parse(&ev.PrevSettings); err != nil {
			return fmt.Errorf("prev_settings.%w", err)
		}
	}
	ev.SettingsOnly = p.SettingsOnly && ev.SettingsChanged
	return nil
}

// roomPayload is the decoded JSON of a room's message
// (wire.AppendRoomEvent).
type roomPayload struct {
	Room    *string `json:"room"`
	UserID  *string `json:"user_id"`
	Event   string  `json:"event"`
	Reason  string  `json:"reason"`
	Count   *int    `json:"count"`
	Version uint64  `json:"version"`
	At      string  `json:"at"`
}

// decodeRoomEvent parses the payload of a room's message into ev; its
// Status and Settings are left zero (they travel in the member header:
// decodeMember). Anything missing or malformed is an error; ev is then
// undefined.
func decodeRoomEvent(data []byte, ev *presence.RoomEvent) error {
	var p roomPayload
	if err := json.Unmarshal(data, &p); err != nil {
		return err
	}
	if p.Room == nil || *p.Room == "" {
		return errors.New("no room")
	}
	if p.UserID == nil || *p.UserID == "" {
		return errors.New("no user_id")
	}
	if p.Count == nil || *p.Count < 0 {
		return errors.New("no count, or a negative one")
	}
	*ev = presence.RoomEvent{Room: *p.Room, UserID: *p.UserID, Count: *p.Count, Version: p.Version}
	var err error
	if ev.Kind, err = parseRoomKind(p.Event); err != nil {
		return err
	}
	if ev.Reason, err = parseRoomReason(p.Reason); err != nil {
		return err
	}
	if ev.At, err = parseTime(p.At); err != nil {
		return fmt.Errorf("at: %w", err)
	}
	return nil
}

// parseRoomKind parses "join" or "leave" (RoomKind.String).
func parseRoomKind(s string) (presence.RoomKind, error) {
	for k := presence.RoomJoin; k <= presence.RoomLeave; k++ {
		if k.String() == s {
			return k, nil
		}
	}
	return 0, fmt.Errorf("unknown event %q", s)
}

// parseRoomReason parses a reason of a room event (RoomReason.String).
func parseRoomReason(s string) (presence.RoomReason, error) {
	for r := presence.ReasonJoined; r <= presence.ReasonVisible; r++ {
		if r.String() == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("unknown reason %q", s)
}

// memberHeader carries, on a join's message, the member's public status
// and privacy settings ("busy contacts everyone": the status, who sees
// it, who sees last_seen), which each node's room watchers are shown as
// their relation to the member allows. They are not in the JSON body:
// that is the public format of the stream's readers and webhooks, which
// the room events reach without them.
const memberHeader = "Presenced-Member"

// memberValue is the value of a join's memberHeader.
func memberValue(ev *presence.RoomEvent) string {
	return ev.Status.Public().String() + " " + ev.Settings.Status.String() + " " + ev.Settings.LastSeen.String()
}

// hiddenMember is what a join without a readable memberHeader is taken
// to show: nothing to anyone but the member, the side that shows less.
var hiddenMember = presence.Settings{Status: presence.Nobody, LastSeen: presence.Nobody}

// decodeMember sets a join's Status and Settings from the value of its
// memberHeader (memberValue). With no value (a message from a publisher
// that does not send it), or one that does not parse (then the error
// says why), the join shows the member offline and its status to nobody
// (hiddenMember). A leave carries none: it is left as it is.
func decodeMember(v string, ev *presence.RoomEvent) error {
	if ev.Kind != presence.RoomJoin {
		return nil
	}
	ev.Status, ev.Settings = presence.Offline, hiddenMember
	if v == "" {
		return nil
	}
	f := strings.Fields(v)
	if len(f) != 3 {
		return fmt.Errorf("%s %q: want a status and two visibilities", memberHeader, v)
	}
	st, err := parseStatus(f[0])
	if err != nil {
		return fmt.Errorf("%s: %w", memberHeader, err)
	}
	var set presence.Settings
	if set.Status, err = presence.ParseVisibility(f[1]); err != nil {
		return fmt.Errorf("%s: %w", memberHeader, err)
	}
	if set.LastSeen, err = presence.ParseVisibility(f[2]); err != nil {
		return fmt.Errorf("%s: %w", memberHeader, err)
	}
	ev.Status, ev.Settings = st, set
	return nil
}

// parseSelf parses a status as the user sees it (invisible included).
func parseSelf(s string) (presence.Status, error) {
	if s == presence.Invisible.String() {
		return presence.Invisible, nil
	}
	return parseStatus(s)
}

// parseStatus parses a public status ("offline", "online", "away", "busy").
// The presence package parses only the statuses a user may set, so the
// names are matched against Status.String here.
func parseStatus(s string) (presence.Status, error) {
	for st := presence.Offline; st < presence.Invisible; st++ {
		if st.String() == s {
			return st, nil
		}
	}
	return 0, fmt.Errorf("unknown status %q", s)
}

func parseTime(s string) (int64, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, err
	}
	return t.UnixMilli(), nil
}

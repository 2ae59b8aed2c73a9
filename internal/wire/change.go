package wire

import (
	"strconv"

	"github.com/presenced/presenced/internal/presence"
)

// AppendChange appends the JSON of a change of presence as it leaves the
// node — on the presence.changes stream, in webhooks, on Kafka:
//
//	{"user_id":"42","status":"online","prev":"offline","text":"",
//	 "last_seen":"2026-01-02T03:04:05.678Z","version":4294967297,
//	 "at":"2026-01-02T03:04:05.678Z",
//	 "settings":{"status":"everyone","last_seen":"contacts"}}
//
// plus "self_status":"invisible" when the user is invisible (shown
// offline), "self_text" when the user's own text is not the public one
// (an invisible user whose text changed since they vanished: "text" stays
// what everyone saw then), "self_only":true for a change only the user
// sees (presence.Event.SelfOnly: nothing anyone else sees changed),
// "prev_settings" when the change is one of settings and
// "settings_only":true when nothing else changed. It is the true state,
// for holders of the API key and the node's own fan-out, never a client.
func AppendChange(b []byte, ev *presence.Event) []byte {
	b = append(b, `{"user_id":`...)
	b = AppendString(b, ev.UserID)
	b = append(b, `,"status":"`...)
	b = append(b, ev.Status.String()...)
	b = append(b, `","prev":"`...)
	b = append(b, ev.Prev.String()...)
	b = append(b, `","text":`...)
	b = AppendString(b, ev.Text)
	b = append(b, `,"last_seen":`...)
	if ev.LastSeen == 0 {
		b = append(b, "null"...)
	} else {
		b = AppendTime(b, ev.LastSeen)
	}
	b = append(b, `,"version":`...)
	b = strconv.AppendUint(b, ev.Version, 10)
	b = append(b, `,"at":`...)
	b = AppendTime(b, ev.At)
	b = appendSettings(b, `,"settings":`, &ev.Settings)
	if ev.Self == presence.Invisible && ev.Status == presence.Offline {
		b = append(b, `,"self_status":"`...)
		b = append(b, ev.Self.String()...)
		b = append(b, '"')
	}
	if ev.SelfText != ev.Text {
		b = append(b, `,"self_text":`...)
		b = AppendString(b, ev.SelfText)
	}
	if ev.SelfOnly {
		b = append(b, `,"self_only":true`...)
	}
	if ev.SettingsChanged {
		b = appendSettings(b, `,"prev_settings":`, &ev.PrevSettings)
	}
	if ev.SettingsOnly {
		b = append(b, `,"settings_only":true`...)
	}
	return append(b, '}')
}

func appendSettings(b []byte, key string, s *presence.Settings) []byte {
	b = append(b, key...)
	b = append(b, `{"status":"`...)
	b = append(b, s.Status.String()...)
	b = append(b, `","last_seen":"`...)
	b = append(b, s.LastSeen.String()...)
	return append(b, `"}`...)
}

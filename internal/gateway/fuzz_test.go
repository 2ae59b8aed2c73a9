package gateway

import (
	"strings"
	"testing"

	"github.com/presenced/presenced/internal/presence"
)

// FuzzDecodeClientMessage: the decoder never panics, and whatever it
// accepts is valid.
func FuzzDecodeClientMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"heartbeat"}`,
		`{"type":"heartbeat","active":false}`,
		`{"type":"set_status","status":"busy","text":"in a meeting"}`,
		`{"type":"set_status","status":"online"}`,
		`{"type":"set_status","status":"invisible","text":null}`,
		`{"type":"subscribe","user_ids":["2","3","2"]}`,
		`{"type":"unsubscribe","user_ids":["2"]}`,
		`{"type":"bye"}`,
		`{"type":"bye","x":1}`,
		`{"type":"dance"}`,
		`{}`, `[]`, `null`, ``, `{"type":"heartbeat"}{}`,
		`{"type":"subscribe","user_ids":["a b"]}`,
		`{"type":"set_status","status":"busy","text":"\u202e"}`,
		`{"type":"set_status","status":"busy","Status":"invisible"}`,
		`{"type":"heartbeat","type":"bye"}`,
		`{"TYPE":"bye"}`,
		`{"type":"subscribe","user_ids":["caf\u0065\u0301"]}`,
		`{"type":"subscribe","user_ids":["\u212a"],"user_ids":["K"]}`,
		`{"ty\u0070e":"heartbeat","active":false}`,
		"{\"type\":\"set_status\",\"status\":\"busy\",\"text\":\"\xff\"}",
		`{"type":"join","room":"doc-42"}`,
		`{"type":"leave","room":"doc-42"}`,
		`{"type":"watch_room","room":"team-7-x"}`,
		`{"type":"unwatch_room","room":"r"}`,
		`{"type":"join"}`,
		`{"type":"join","room":null}`,
		`{"type":"join","room":7}`,
		`{"type":"join","room":""}`,
		`{"type":"join","room":"a b"}`,
		`{"type":"join","room":"caf\u0065\u0301"}`,
		`{"type":"join","room":"r","user_ids":["2"]}`,
		`{"type":"subscribe","user_ids":["2"],"room":"r"}`,
		`{"type":"watch_room","room":"r","room":"s"}`,
		`{"type":"leave","Room":"r"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, perr := decodeClientMessage(b)
		if perr != nil {
			if perr.code == "" || perr.message == "" {
				t.Fatalf("error without code or message: %+v", perr)
			}
			return
		}
		switch m.kind {
		case msgHeartbeat, msgBye:
		case msgJoin, msgLeave, msgWatchRoom, msgUnwatchRoom:
			if err := presence.ValidateID(m.room); err != nil {
				t.Fatalf("accepted room %q: %v", m.room, err)
			}
		case msgSetStatus:
			if err := presence.ValidateText(m.text); err != nil {
				t.Fatalf("accepted text %q: %v", m.text, err)
			}
		case msgSubscribe, msgUnsubscribe:
			if len(m.userIDs) == 0 {
				t.Fatal("accepted no ids")
			}
			seen := map[string]bool{}
			for _, id := range m.userIDs {
				if err := presence.ValidateID(id); err != nil || seen[id] {
					t.Fatalf("accepted id %q (dup %v): %v", id, seen[id], err)
				}
				seen[id] = true
			}
		default:
			t.Fatalf("accepted %q as kind %d", b, m.kind)
		}
	})
}

// TestDecodeRoomMessages: the messages of rooms carry a valid room id and
// nothing else.
func TestDecodeRoomMessages(t *testing.T) {
	for _, tc := range []struct {
		msg        string
		kind       int
		room       string
		code, text string // of the refusal
	}{
		{msg: `{"type":"join","room":"doc-42"}`, kind: msgJoin, room: "doc-42"},
		{msg: `{"room":"doc-42","type":"leave"}`, kind: msgLeave, room: "doc-42"},
		{msg: `{"type":"watch_room","room":"é"}`, kind: msgWatchRoom, room: "é"},
		{msg: `{"type":"unwatch_room","room":"r"}`, kind: msgUnwatchRoom, room: "r"},
		{msg: `{"type":"join"}`, code: "invalid_id", text: "room is required"},
		{msg: `{"type":"leave","room":null}`, code: "invalid_id", text: "room is required"},
		{msg: `{"type":"watch_room","room":["r"]}`, code: "invalid_id", text: "room must be a string"},
		{msg: `{"type":"join","room":""}`, code: "invalid_id", text: "room: id is empty"},
		{msg: `{"type":"join","room":"a b"}`, code: "invalid_id", text: "room: id contains a forbidden character"},
		{msg: `{"type":"join","room":"a,b"}`, code: "invalid_id", text: "room: id contains a forbidden character"},
		{msg: `{"type":"unwatch_room","room":"caf\u0065\u0301"}`, code: "invalid_id", text: "room: id is not in Unicode normalization form NFC"},
		{msg: `{"type":"join","room":"` + strings.Repeat("x", presence.MaxIDLen+1) + `"}`, code: "invalid_id", text: "room: id is"},
		{msg: `{"type":"join","room":"r","text":"x"}`, code: "invalid_json", text: `a join message has no field "text"`},
		{msg: `{"type":"subscribe","user_ids":["2"],"room":"r"}`, code: "invalid_json", text: `a subscribe message has no field "room"`},
		{msg: `{"type":"watch_room","room":"r","room":"s"}`, code: "invalid_json"},
		{msg: `{"type":"leave","Room":"r"}`, code: "invalid_json"},
		{msg: `{"type":"enter","room":"r"}`, code: "unknown_type", text: "join, leave, watch_room or unwatch_room"},
		{msg: `{"room":"r"}`, code: "unknown_type", text: "join, leave, watch_room or unwatch_room"},
	} {
		m, perr := decodeClientMessage([]byte(tc.msg))
		switch {
		case tc.code == "" && (perr != nil || m.kind != tc.kind || m.room != tc.room):
			t.Errorf("%s: got %+v %+v, want kind %d room %q", tc.msg, m, perr, tc.kind, tc.room)
		case tc.code != "" && (perr == nil || perr.code != tc.code || !strings.Contains(perr.message, tc.text)):
			t.Errorf("%s: got %+v %+v, want %s %q", tc.msg, m, perr, tc.code, tc.text)
		}
	}
}

// The byte-for-byte heartbeats skip the JSON decoder; they must mean what
// the decoder makes of the same message written differently.
func TestHeartbeatFastPath(t *testing.T) {
	for fast, slow := range map[string]string{
		`{"type":"heartbeat"}`:                `{ "type": "heartbeat" }`,
		`{"type":"heartbeat","active":false}`: `{"active": false, "type":"heartbeat"}`,
		`{"type":"heartbeat","active":true}`:  `{"active": true, "type":"heartbeat"}`,
	} {
		m1, e1 := decodeClientMessage([]byte(fast))
		m2, e2 := decodeClientMessage([]byte(slow))
		if e1 != nil || e2 != nil || m1.kind != msgHeartbeat || m1.kind != m2.kind || m1.active != m2.active {
			t.Errorf("%s → %+v %v; %s → %+v %v", fast, m1, e1, slow, m2, e2)
		}
	}
	hb := []byte(`{"type":"heartbeat"}`)
	if allocs := testing.AllocsPerRun(100, func() { _, _ = decodeClientMessage(hb) }); allocs != 0 {
		t.Errorf("a heartbeat allocates %v times to decode", allocs)
	}
}

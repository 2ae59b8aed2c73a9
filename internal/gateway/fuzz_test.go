package gateway

import (
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

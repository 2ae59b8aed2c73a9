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

package ingest

import (
	"errors"
	"testing"
	"time"
)

func TestByeMemory(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 1, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	k := devKey{"u", "d"}
	m := NewMemory(time.Minute, 3)

	if !m.beatAllowed(k, ms(0), t0) || !m.byeAllowed(k, ms(0), t0) {
		t.Fatal("an unknown device is refused")
	}
	m.recordBye(k, ms(100), t0)
	for _, c := range []struct {
		at   int
		want bool
	}{{50, false}, {100, false}, {101, true}} {
		if got := m.beatAllowed(k, ms(c.at), t0); got != c.want {
			t.Errorf("beat at %d after a bye at 100: allowed %v, want %v", c.at, got, c.want)
		}
	}
	// The beat at 101 was remembered: an older bye no longer applies.
	if m.byeAllowed(k, ms(100), t0) {
		t.Error("a bye at 100 allowed after a reconnect at 101")
	}
	if !m.byeAllowed(k, ms(102), t0) {
		t.Error("a bye at 102 refused after a reconnect at 101")
	}
	// An older bye recorded does not move the remembered one back.
	m.recordBye(k, ms(10), t0)
	if m.beatAllowed(k, ms(99), t0) {
		t.Error("a beat at 99 allowed after byes at 100 and 10")
	}

	// Entries live for their life, then expire.
	if m.beatAllowed(k, ms(100), t0.Add(59*time.Second)) {
		t.Error("a beat at 100 allowed before the entry expired")
	}
	if !m.beatAllowed(k, ms(100), t0.Add(time.Minute)) || m.Len() != 0 {
		t.Errorf("entry not expired after its life (len %d)", m.Len())
	}

	// Bounded: the oldest is dropped first.
	for i, u := range []string{"a", "b", "c", "d"} {
		m.recordBye(devKey{u, "d"}, ms(100), t0.Add(time.Duration(i)*time.Millisecond))
	}
	if m.Len() != 3 {
		t.Errorf("len %d, want 3", m.Len())
	}
	if !m.beatAllowed(devKey{"a", "d"}, ms(50), t0) || m.beatAllowed(devKey{"d", "d"}, ms(50), t0) {
		t.Error("not the oldest entry dropped when full")
	}
}

func TestRetryDelay(t *testing.T) {
	c := &Consumer{cfg: Config{RetryDelay: 100 * time.Millisecond, RetryMaxDelay: time.Second}}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := c.retryDelay(uint64(i + 1)); got != w*time.Millisecond {
			t.Errorf("delivery %d: delay %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
}

func TestDecode(t *testing.T) {
	now := time.Date(2026, 11, 23, 1, 2, 3, 456e6, time.UTC)
	ev, err := Decode([]byte(`{"type":"heartbeat","user_id":"42","device_id":"tab-1","at":"2026-11-23T01:02:03.456Z","active":false,"extra":1}`), now, 5*time.Second)
	if err != nil || ev.Bye || ev.User != "42" || ev.Device != "tab-1" || !ev.At.Equal(now) || ev.Active {
		t.Errorf("decode = %+v, %v", ev, err)
	}
	ev, err = Decode([]byte(`{"type":"session_connected","user_id":"42","device_id":"d","at":"2026-11-23T01:02:07Z"}`), now, 5*time.Second)
	if err != nil || !ev.Active || ev.Bye {
		t.Errorf("connect without active: %+v, %v; want active", ev, err)
	}
	ev, err = Decode([]byte(`{"type":"session_disconnected","user_id":"42","device_id":"d","at":"2026-11-23T02:02:03.456+01:00"}`), now, 5*time.Second)
	if err != nil || !ev.Bye || !ev.At.Equal(now) {
		t.Errorf("disconnect with an offset: %+v, %v", ev, err)
	}
}

// Events are read by the rule of every other input: a duplicated key, a
// key in another case, or invalid UTF-8 is refused, not resolved.
func TestDecodeIsStrict(t *testing.T) {
	now := time.Date(2026, 11, 23, 1, 2, 3, 456e6, time.UTC)
	for _, in := range []string{
		`{"type":"heartbeat","user_id":"42","user_id":"43","device_id":"d","at":"2026-11-23T01:02:03Z"}`,
		`{"type":"heartbeat","type":"session_disconnected","user_id":"42","device_id":"d","at":"2026-11-23T01:02:03Z"}`,
		`{"type":"heartbeat","USER_ID":"42","device_id":"d","at":"2026-11-23T01:02:03Z"}`,
		"{\"type\":\"heartbeat\",\"user_id\":\"4\xff\",\"device_id\":\"d\",\"at\":\"2026-11-23T01:02:03Z\"}",
		`{"type":"heartbeat","user_id":"42","device_id":"d","at":"2026-11-23T01:02:03Z"} {}`,
		`{"type":"heartbeat","user_id":42,"device_id":"d","at":"2026-11-23T01:02:03Z"}`,
	} {
		if ev, err := Decode([]byte(in), now, 5*time.Second); !errors.Is(err, ErrInvalid) {
			t.Errorf("Decode(%q) = %+v, %v; want ErrInvalid", in, ev, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	now := time.Date(2026, 11, 23, 1, 2, 3, 0, time.UTC)
	f.Add([]byte(`{"type":"heartbeat","user_id":"42","device_id":"tab-1","at":"2026-11-23T01:02:03.456Z","active":true}`))
	f.Add([]byte(`{"type":"session_disconnected","user_id":"ü","device_id":"x","at":"2026-11-23T01:02:03Z"}`))
	f.Add([]byte(`{"type":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		ev, err := Decode(data, now, 5*time.Second)
		if err != nil {
			return
		}
		if ev.User == "" || ev.Device == "" || ev.At.After(now.Add(5*time.Second)) || len(data) > MaxMessageSize {
			t.Errorf("Decode(%q) accepted %+v", data, ev)
		}
	})
}

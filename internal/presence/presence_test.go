package presence_test

import (
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/presence"
)

func TestValidateID(t *testing.T) {
	good := []string{
		"1", "9223372036854775807", "550e8400-e29b-41d4-a716-446655440000", strings.Repeat("a", 64),
		"zoë", "名前", "user@example.com", "a\u00a1", "a\u2027b", "a\u2030", "a\ufffc", "🙂",
		"caf\u00e9", "K", "\u03a9", "한국",
		// Look-alikes that are other characters are other ids: full-width,
		// Cyrillic, compatibility forms (NFKC would fold them; NFC does not).
		"\uff21", "\u0430dmin", "\ufb01le", "x\u00b2",
		strings.Repeat("é", 32), // 64 bytes
	}
	for _, id := range good {
		if err := presence.ValidateID(id); err != nil {
			t.Errorf("ValidateID(%q): %v, want ok", id, err)
		}
	}
	bad := []struct {
		id, want string // want: in the error
	}{
		{"", "empty"},
		{strings.Repeat("a", 65), "65 bytes"},
		{strings.Repeat("é", 32) + "a", "65 bytes"},
		{"a b", "forbidden"},
		{"a,b", "forbidden"},
		{"a\tb", "forbidden"},
		{"a\x00", "forbidden"},
		{"a\x7f", "forbidden"},
		{"a\xffb", "UTF-8"},
		{"\xc2", "UTF-8"},
		// Not NFC: the same text as an id that is, so refused.
		{"cafe\u0301", `is "caf\u00e9" in NFC`},
		{"\u212a", `is "K" in NFC`}, // Kelvin sign
		{"\u2126", "NFC"},           // Ohm sign
		{"\u1100\u1161", "NFC"},     // Hangul jamo that compose
		{"a\u0301\u0328", "NFC"},    // combining marks out of canonical order
		// C1 controls: NEL and the ends of the range.
		{"a\u0085b", "U+0085"},
		{"\u0080", "U+0080"},
		{"a\u009f", "U+009F"},
		// Bidirectional embeddings, overrides and isolates.
		{"a\u202ab", "U+202A"},
		{"a\u202bb", "U+202B"},
		{"a\u202cb", "U+202C"},
		{"a\u202db", "U+202D"},
		{"admin\u202egpj.exe", "U+202E"},
		{"a\u2066b", "U+2066"},
		{"a\u2067b", "U+2067"},
		{"a\u2068b", "U+2068"},
		{"a\u2069b", "U+2069"},
		// Line and paragraph separators.
		{"a\u2028b", "U+2028"},
		{"a\u2029b", "U+2029"},
		// What invalid bytes in a JSON body decode to.
		{"a\ufffdb", "U+FFFD"},
		{"\ufffd", "U+FFFD"},
		// Invisible: ali\u200bce must not pass for alice.
		{"ali\u200bce", "U+200B"}, // zero-width space
		{"a\u200cb", "U+200C"},    // zero-width non-joiner
		{"a\u200db", "U+200D"},    // zero-width joiner
		{"a\u2060b", "U+2060"},    // word joiner
		{"\ufeffa", "U+FEFF"},     // byte order mark
		{"a\u00adb", "U+00AD"},    // soft hyphen
		{"a\u3164", "U+3164"},     // Hangul filler
		{"a\u115fb", "U+115F"},
		{"a\ufe0fb", "U+FE0F"},     // variation selector
		{"a\U000e0041", "U+E0041"}, // tag
		{"a\u00a0b", "U+00A0"},     // no-break space
		{"a\u3000b", "U+3000"},     // ideographic space
		{"a\u2007b", "U+2007"},
	}
	for _, tc := range bad {
		err := presence.ValidateID(tc.id)
		if err == nil {
			t.Errorf("ValidateID(%q): ok, want an error", tc.id)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ValidateID(%q): %v, want it to mention %q", tc.id, err, tc.want)
		}
	}
}

func TestValidateText(t *testing.T) {
	good := []string{
		"", "in a meeting", strings.Repeat("🙂", 140), "\u00a0no-break", `quote " backslash \`,
		"שלום עולם", "coding 👩\u200d💻", "🏳\ufe0f\u200d🌈 pride", "👨\u200d👩\u200d👧", "❤️",
	}
	for _, s := range good {
		if err := presence.ValidateText(s); err != nil {
			t.Errorf("ValidateText(%q): %v, want ok", s, err)
		}
	}
	bad := []struct{ text, want string }{
		{strings.Repeat("a", 141), "141"},
		{"a\nb", "control"},
		{"a\x00", "control"},
		{"a\x7f", "control"},
		{"a\u0085b", "U+0085"},
		{"\u0080", "U+0080"},
		{"\u009b31m", "U+009B"},
		{"a\xffb", "UTF-8"},
		// Format, separator and invisible characters, like ids.
		{"\u202eright to left", "U+202E"},
		{"a\u2066b", "U+2066"},
		{"a\u200fb", "U+200F"},
		{"line\u2028para", "U+2028"},
		{"para\u2029", "U+2029"},
		{"\ufffd", "U+FFFD"}, // what invalid bytes in JSON decode to
		{"a\u200bb", "U+200B"},
		{"ali\u200dce", "U+200D"}, // a joiner between letters is no emoji
		{"\u200d🙂", "U+200D"},
		{"🙂\u200d", "U+200D"},
		{"\ufeff", "U+FEFF"},
		{"a\u3164", "U+3164"},
	}
	for _, tc := range bad {
		err := presence.ValidateText(tc.text)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ValidateText(%q): %v, want an error mentioning %q", tc.text, err, tc.want)
		}
	}
}

// Zero rules take the defaults; chosen ones are kept.
func TestRulesWithDefaults(t *testing.T) {
	got := presence.Rules{}.WithDefaults()
	if got != (presence.Rules{TTL: presence.DefaultTTL, IdleAfter: presence.DefaultIdleAfter, MaxDevices: presence.DefaultMaxDevices,
		CloseGrace: presence.DefaultCloseGrace}) {
		t.Fatalf("zero rules: %+v", got)
	}
	set := presence.Rules{TTL: 10 * time.Second, IdleAfter: time.Minute, MaxDevices: 3, CloseGrace: 2 * time.Second, Epoch: 7}
	if got := set.WithDefaults(); got != set {
		t.Fatalf("chosen rules %+v became %+v", set, got)
	}
	// The close grace is never longer than the ttl.
	short := presence.Rules{TTL: time.Second}.WithDefaults()
	if short.CloseGrace != time.Second {
		t.Fatalf("ttl 1s: close grace %s, want 1s (cut to the ttl)", short.CloseGrace)
	}
}

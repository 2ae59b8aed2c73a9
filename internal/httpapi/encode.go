package httpapi

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/presenced/presenced/internal/privacy"
)

// Hand-written JSON for the hot read paths: one buffer, no reflection.

const hex = "0123456789abcdef"

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD;
// U+2028 and U+2029 are escaped so the output is also valid JavaScript.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendTime appends a Unix-ms time as an RFC 3339 UTC string with
// milliseconds, e.g. "2026-11-22T23:08:49.123Z".
func appendTime(b []byte, ms int64) []byte {
	b = append(b, '"')
	b = time.UnixMilli(ms).UTC().AppendFormat(b, "2006-01-02T15:04:05.000Z07:00")
	return append(b, '"')
}

func formatTime(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// appendStatus appends the status of v, or null when it is hidden.
func appendStatus(b []byte, v *privacy.View) []byte {
	if !v.StatusVisible {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = append(b, v.Status.String()...)
	return append(b, '"')
}

// appendView appends the rich view of one user:
// {"user_id","status","last_seen","status_text","devices","version"}.
func appendView(b []byte, v *privacy.View) []byte {
	b = append(b, `{"user_id":`...)
	b = appendString(b, v.UserID)
	b = append(b, `,"status":`...)
	b = appendStatus(b, v)
	b = append(b, `,"last_seen":`...)
	if v.LastSeenVisible {
		b = appendTime(b, v.LastSeen)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"status_text":`...)
	if v.StatusVisible && v.Text != "" {
		b = appendString(b, v.Text)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"devices":`...)
	if v.StatusVisible {
		b = strconv.AppendInt(b, int64(v.Devices), 10)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"version":`...)
	if v.StatusVisible && v.Version != 0 {
		b = strconv.AppendUint(b, v.Version, 10)
	} else {
		b = append(b, "null"...)
	}
	return append(b, '}')
}

// Package wire is the JSON that presence leaves the server as: the string,
// time and view encoders of the HTTP read paths, the messages of the
// WebSocket protocol (docs/protocol.md), and the changes of users and
// rooms as the API key's exits carry them. Everything is hand-written and
// appends to a caller's buffer, so a message is built once, with no
// reflection, and the same bytes can go to every watcher of one view.
//
// The encoders take views that have been through the privacy filter; they
// only decide how a hidden or absent field reads (null). All functions are
// pure and safe for concurrent use.
package wire

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/presenced/presenced/internal/privacy"
)

const hex = "0123456789abcdef"

// TimeLayout is the layout of every time on the wire: RFC 3339 in UTC with
// milliseconds, e.g. "2026-11-22T23:08:49.123Z".
const TimeLayout = "2006-01-02T15:04:05.000Z07:00"

// AppendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD;
// U+2028 and U+2029 are escaped so the output is also valid JavaScript.
func AppendString(b []byte, s string) []byte {
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

// AppendTime appends a Unix-ms time as a JSON string in TimeLayout.
func AppendTime(b []byte, ms int64) []byte {
	b = append(b, '"')
	b = appendTime(b, time.UnixMilli(ms).UTC())
	return append(b, '"')
}

// appendTime is t.AppendFormat(b, TimeLayout) for a UTC t, written out
// digit by digit for the years 0–9999: a full view of 1,000 users formats
// 1,000 of them, and the layout's interpretation was most of that.
func appendTime(b []byte, t time.Time) []byte {
	y, mo, d := t.Date()
	if y < 0 || y > 9999 {
		return t.AppendFormat(b, TimeLayout)
	}
	h, mi, s := t.Clock()
	ms := t.Nanosecond() / int(time.Millisecond)
	return append(b,
		byte('0'+y/1000), byte('0'+y/100%10), byte('0'+y/10%10), byte('0'+y%10), '-',
		byte('0'+int(mo)/10), byte('0'+int(mo)%10), '-',
		byte('0'+d/10), byte('0'+d%10), 'T',
		byte('0'+h/10), byte('0'+h%10), ':',
		byte('0'+mi/10), byte('0'+mi%10), ':',
		byte('0'+s/10), byte('0'+s%10), '.',
		byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10), 'Z')
}

// FormatTime returns a Unix-ms time in TimeLayout (without quotes).
func FormatTime(ms int64) string {
	return string(appendTime(make([]byte, 0, len(TimeLayout)), time.UnixMilli(ms).UTC()))
}

// AppendStatus appends the status of v as a JSON string, or null when it is
// hidden.
func AppendStatus(b []byte, v *privacy.View) []byte {
	if !v.StatusVisible {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = append(b, v.Status.String()...)
	return append(b, '"')
}

// AppendLastSeen appends the last_seen of v, or null when it is hidden or
// the user was never seen.
func AppendLastSeen(b []byte, v *privacy.View) []byte {
	if !v.LastSeenVisible {
		return append(b, "null"...)
	}
	return AppendTime(b, v.LastSeen)
}

// AppendText appends the status text of v, or null when the status is
// hidden or there is no text.
func AppendText(b []byte, v *privacy.View) []byte {
	if !v.StatusVisible || v.Text == "" {
		return append(b, "null"...)
	}
	return AppendString(b, v.Text)
}

// AppendVersion appends the version of v, or null when the user has no
// version yet or the status is hidden (privacy.Filter leaves Version 0
// then; only the view of a watcher who just lost sight of the status,
// privacy.Delivery and Reveal, has one: the version it was hidden at).
func AppendVersion(b []byte, v *privacy.View) []byte {
	if v.Version == 0 {
		return append(b, "null"...)
	}
	return strconv.AppendUint(b, v.Version, 10)
}

// AppendView appends the rich view of one user of the HTTP API:
// {"user_id","status","last_seen","status_text","devices","version"}.
func AppendView(b []byte, v *privacy.View) []byte {
	b = append(b, `{"user_id":`...)
	b = AppendString(b, v.UserID)
	b = append(b, `,"status":`...)
	b = AppendStatus(b, v)
	b = append(b, `,"last_seen":`...)
	b = AppendLastSeen(b, v)
	b = append(b, `,"status_text":`...)
	b = AppendText(b, v)
	b = append(b, `,"devices":`...)
	if v.StatusVisible {
		b = strconv.AppendInt(b, int64(v.Devices), 10)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"version":`...)
	b = AppendVersion(b, v)
	return append(b, '}')
}

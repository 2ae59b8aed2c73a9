// Package webhooksig is the signature of presenced's webhook requests:
// the two headers, how a body is signed (Sign) and how a receiver checks
// a request (Verify); the format is in docs/operations.md, "Webhooks".
// The server signs with it (internal/webhook) and the public Go client
// hands it on to receivers (client.VerifyWebhook), so both always agree.
// Its functions are pure and safe for concurrent use.
package webhooksig

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The headers of a signed request.
const (
	// TimestampHeader holds when the request was signed, in Unix seconds.
	TimestampHeader = "Presenced-Webhook-Timestamp"
	// SignatureHeader holds "v1=" and the hex HMAC-SHA256, under the
	// webhook secret, of the timestamp, a dot and the body.
	SignatureHeader = "Presenced-Webhook-Signature"
)

// Sign returns the value of SignatureHeader for a body sent at timestamp
// (Unix seconds) under secret.
func Sign(secret []byte, timestamp int64, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(strconv.AppendInt(nil, timestamp, 10))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1=" + hex.EncodeToString(m.Sum(nil))
}

// ErrSignature is returned (wrapped, with the reason) by Verify for a
// request that was not signed with the secret, or not recently.
var ErrSignature = errors.New("presenced webhook: bad signature")

// Verify checks that a request with header h and body was signed with
// secret within tolerance of now (a replayed old request is refused).
// SignatureHeader may list several signatures, separated by commas: one
// that matches suffices.
func Verify(secret []byte, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	ts, err := strconv.ParseInt(h.Get(TimestampHeader), 10, 64)
	if err != nil {
		return fmt.Errorf("%w: no valid %s", ErrSignature, TimestampHeader)
	}
	if d := now.Unix() - ts; math.Abs(float64(d)) > tolerance.Seconds() {
		return fmt.Errorf("%w: signed %ds away from now, more than %s", ErrSignature, d, tolerance)
	}
	want := Sign(secret, ts, body)
	for _, got := range strings.Split(h.Get(SignatureHeader), ",") {
		if hmac.Equal([]byte(strings.TrimSpace(got)), []byte(want)) {
			return nil
		}
	}
	return ErrSignature
}

package client

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

// Headers of a presenced webhook request (docs/operations.md, "Webhooks").
const (
	// WebhookTimestampHeader holds when the request was signed, in Unix
	// seconds.
	WebhookTimestampHeader = "Presenced-Webhook-Timestamp"
	// WebhookSignatureHeader holds "v1=" and the hex HMAC-SHA256, under the
	// webhook secret, of the timestamp, a dot and the body.
	WebhookSignatureHeader = "Presenced-Webhook-Signature"
)

// WebhookSignature is the value of WebhookSignatureHeader for a body sent at
// timestamp (Unix seconds) under secret.
func WebhookSignature(secret []byte, timestamp int64, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(strconv.AppendInt(nil, timestamp, 10))
	m.Write([]byte{'.'})
	m.Write(body)
	return "v1=" + hex.EncodeToString(m.Sum(nil))
}

// ErrWebhookSignature is returned by VerifyWebhook for a request that was
// not signed with the secret, or not recently.
var ErrWebhookSignature = errors.New("presenced webhook: bad signature")

// VerifyWebhook checks that a webhook request with header h and body was
// signed with secret within tolerance of now (a replayed old request is
// refused). Read the body whole before calling it, and answer 2xx only
// after the events are safely stored: presenced retries anything else.
func VerifyWebhook(secret []byte, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	ts, err := strconv.ParseInt(h.Get(WebhookTimestampHeader), 10, 64)
	if err != nil {
		return fmt.Errorf("%w: no valid %s", ErrWebhookSignature, WebhookTimestampHeader)
	}
	if d := now.Unix() - ts; math.Abs(float64(d)) > tolerance.Seconds() {
		return fmt.Errorf("%w: signed %ds away from now, more than %s", ErrWebhookSignature, d, tolerance)
	}
	want := WebhookSignature(secret, ts, body)
	for _, got := range strings.Split(h.Get(WebhookSignatureHeader), ",") {
		if hmac.Equal([]byte(strings.TrimSpace(got)), []byte(want)) {
			return nil
		}
	}
	return ErrWebhookSignature
}

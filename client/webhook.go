package client

import (
	"net/http"
	"time"

	"github.com/presenced/presenced/internal/webhooksig"
)

// Headers of a presenced webhook request (docs/operations.md, "Webhooks").
const (
	// WebhookTimestampHeader holds when the request was signed, in Unix
	// seconds.
	WebhookTimestampHeader = webhooksig.TimestampHeader
	// WebhookSignatureHeader holds "v1=" and the hex HMAC-SHA256, under the
	// webhook secret, of the timestamp, a dot and the body.
	WebhookSignatureHeader = webhooksig.SignatureHeader
)

// WebhookSignature is the value of WebhookSignatureHeader for a body sent at
// timestamp (Unix seconds) under secret.
func WebhookSignature(secret []byte, timestamp int64, body []byte) string {
	return webhooksig.Sign(secret, timestamp, body)
}

// ErrWebhookSignature is returned by VerifyWebhook for a request that was
// not signed with the secret, or not recently.
var ErrWebhookSignature = webhooksig.ErrSignature

// VerifyWebhook checks that a webhook request with header h and body was
// signed with secret within tolerance of now (a replayed old request is
// refused). Read the body whole before calling it, and answer 2xx only
// after the events are safely stored: presenced retries anything else.
func VerifyWebhook(secret []byte, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	return webhooksig.Verify(secret, h, body, now, tolerance)
}

package client

import (
	"net/http"
	"testing"
	"time"
)

func TestVerifyWebhook(t *testing.T) {
	secret := []byte("webhook-test-secret-0123456789abcdef")
	body := []byte(`{"events":[]}`)
	now := time.Unix(1_800_000_000, 0)
	h := http.Header{}
	h.Set(WebhookTimestampHeader, "1800000000")
	h.Set(WebhookSignatureHeader, WebhookSignature(secret, now.Unix(), body))
	if err := VerifyWebhook(secret, h, body, now.Add(10*time.Second), time.Minute); err != nil {
		t.Fatalf("a good signature: %v", err)
	}
	for name, check := range map[string]func() error{
		"another body":   func() error { return VerifyWebhook(secret, h, []byte(`{"events":[1]}`), now, time.Minute) },
		"another secret": func() error { return VerifyWebhook([]byte("x"), h, body, now, time.Minute) },
		"too old":        func() error { return VerifyWebhook(secret, h, body, now.Add(time.Hour), time.Minute) },
	} {
		if err := check(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

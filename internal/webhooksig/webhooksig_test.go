package webhooksig_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/webhooksig"
)

// The signature receivers in other languages compute from
// docs/operations.md: HMAC-SHA256 of "<timestamp>.<body>", in hex after
// "v1=" (this value computed apart from the package, with Python's hmac).
func TestSignKnownAnswer(t *testing.T) {
	got := webhooksig.Sign([]byte("webhook-secret"), 1_800_000_000, []byte(`{"events":[]}`))
	const want = "v1=087854b2f413a18c70a8931ad2ffb0f5682d7f0d3fd6f673b5dd29c669950a76"
	if got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
}

// Verify accepts what Sign signed, within the tolerance, also listed
// among other signatures, and refuses everything else with ErrSignature.
func TestVerify(t *testing.T) {
	secret := []byte("webhook-secret")
	body := []byte(`{"events":[]}`)
	now := time.Unix(1_800_000_000, 0)
	signed := func(sigs string) http.Header {
		h := http.Header{}
		h.Set(webhooksig.TimestampHeader, "1800000000")
		h.Set(webhooksig.SignatureHeader, sigs)
		return h
	}
	good := webhooksig.Sign(secret, now.Unix(), body)
	for name, h := range map[string]http.Header{
		"alone":          signed(good),
		"after another":  signed("v1=00, " + good),
		"before another": signed(good + ",v1=00"),
	} {
		// A minute after signing: at the tolerance's edge.
		if err := webhooksig.Verify(secret, h, body, now.Add(time.Minute), time.Minute); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, check := range map[string]func() error{
		"another body": func() error {
			return webhooksig.Verify(secret, signed(good), []byte(`{"events":[1]}`), now, time.Minute)
		},
		"another secret": func() error { return webhooksig.Verify([]byte("x"), signed(good), body, now, time.Minute) },
		"too old": func() error {
			return webhooksig.Verify(secret, signed(good), body, now.Add(61*time.Second), time.Minute)
		},
		"from the future": func() error {
			return webhooksig.Verify(secret, signed(good), body, now.Add(-61*time.Second), time.Minute)
		},
		"no timestamp": func() error {
			return webhooksig.Verify(secret, http.Header{webhooksig.SignatureHeader: {good}}, body, now, time.Minute)
		},
		"no signature":   func() error { return webhooksig.Verify(secret, signed(""), body, now, time.Minute) },
		"another scheme": func() error { return webhooksig.Verify(secret, signed("v2="+good[3:]), body, now, time.Minute) },
	} {
		if err := check(); !errors.Is(err, webhooksig.ErrSignature) {
			t.Errorf("%s: %v, want ErrSignature", name, err)
		}
	}
}

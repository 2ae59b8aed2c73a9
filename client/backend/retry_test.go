package backend

import (
	"net/http"
	"testing"
	"time"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"1", time.Second},
		{"30", 30 * time.Second},
		{"-1", 0},
		{"soon", 0},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
	} {
		if got := retryAfter(tc.in, now); got != tc.want {
			t.Errorf("retryAfter(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// An answer without the node's JSON error (a proxy's page) is still an
// *Error with its status.
func TestAnswerErrorWithoutJSON(t *testing.T) {
	res := &http.Response{StatusCode: 502, Header: http.Header{}}
	e := answerError(res, []byte("<html>bad gateway</html>"))
	if e.Status != 502 || e.Code != "" || e.Message != "Bad Gateway: <html>bad gateway</html>" || e.Temporary() {
		t.Errorf("got %+v", e)
	}
	res = &http.Response{StatusCode: 429, Header: http.Header{"Retry-After": {"3"}}}
	e = answerError(res, []byte(`{"error":{"code":"rate_limited","message":"slow down"}}`))
	if e.Code != "rate_limited" || e.Message != "slow down" || e.RetryAfter != 3*time.Second || !e.Temporary() {
		t.Errorf("got %+v", e)
	}
}

func TestNew(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8080", "ftp://x", "http://", "http://x/?a=b"} {
		if _, err := New(Config{URL: u}); err == nil {
			t.Errorf("New(%q): no error", u)
		}
	}
	c, err := New(Config{URL: "https://presence.example/api/", APIKey: "k"})
	if err != nil || c.base != "https://presence.example/api" || c.authz != "Bearer k" || c.client != http.DefaultClient {
		t.Errorf("New: %+v, %v", c, err)
	}
}

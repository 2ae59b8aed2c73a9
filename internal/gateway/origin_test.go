package gateway_test

import (
	"net/http"
	"testing"

	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/origin"
)

// TestUpgradeOrigin: an upgrade from a page of a foreign origin is refused
// with 403 origin_not_allowed and counts as nothing; the node's own pages,
// listed origins and requests without an Origin (not a browser) connect.
func TestUpgradeOrigin(t *testing.T) {
	allowed, err := origin.Parse([]string{"https://app.example.com", "https://*.example.org"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		policy *origin.Policy
		origin string // "": no Origin header; "self": the node's own
		ok     bool
	}{
		{"no Origin, default", nil, "", true},
		{"own origin, default", nil, "self", true},
		{"foreign origin, default", nil, "https://evil.example", false},
		{"own origin's host on another port, default", nil, "http://127.0.0.1:1", false},
		{"null, default", nil, "null", false},
		{"listed origin", allowed, "https://app.example.com", true},
		{"wildcard origin", allowed, "https://tenant.example.org", true},
		{"own origin with a list", allowed, "self", true},
		{"unlisted origin with a list", allowed, "https://app.example.com.evil.example", false},
		{"listed origin of another scheme", allowed, "http://app.example.com", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, opts{tweak: func(c *gateway.Config) { c.Origins = tc.policy }})
			o := tc.origin
			if o == "self" {
				o = n.srv.URL // http://127.0.0.1:port, the Host the client sends
			}
			hdr := http.Header{}
			if o != "" {
				hdr.Set("Origin", o)
			}
			if tc.ok {
				c := n.dialQuery("?token="+n.token("u1", "")+"&device_id=d1", hdr)
				c.msgType("welcome")
				return
			}
			req, err := http.NewRequest("GET", n.srv.URL+"/v1/ws?token="+n.token("ghost", ""), nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header = hdr
			req.Header.Set("Upgrade", "websocket")
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Sec-WebSocket-Version", "13")
			req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Header.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("refused upgrade has Access-Control-Allow-Origin %q", resp.Header.Get("Access-Control-Allow-Origin"))
			}
			wantJSONError(t, "origin "+o, resp, http.StatusForbidden, "origin_not_allowed")
			wantNoState(t, n, "ghost")
			if got := n.gw.Stats().Accepted; got != 0 {
				t.Errorf("accepted %d upgrades, want 0", got)
			}
		})
	}
}

// TestUpgradeOriginBeforeAuth: the Origin is checked before the
// credentials, so a foreign page learns nothing about a token.
func TestUpgradeOriginBeforeAuth(t *testing.T) {
	n := newNode(t, opts{})
	req, err := http.NewRequest("GET", n.srv.URL+"/v1/ws?token=not-a-token", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Origin", "https://evil.example")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	wantJSONError(t, "bad token from a foreign page", resp, http.StatusForbidden, "origin_not_allowed")
}

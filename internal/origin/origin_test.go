package origin_test

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/presenced/presenced/internal/origin"
)

func req(host string, tlsOn bool, origins ...string) *http.Request {
	r := httptest.NewRequest("GET", "http://"+host+"/v1/ws", nil)
	r.Host = host
	for _, o := range origins {
		r.Header.Add("Origin", o)
	}
	if tlsOn {
		r.TLS = &tls.ConnectionState{}
	}
	return r
}

func TestCheck(t *testing.T) {
	list := []string{"https://app.example.com", " http://localhost:3000 ", "https://*.example.org", "https://*.corp.example.net:8443", "HTTP://[::1]:5173", ""}
	p, err := origin.Parse(list)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		host    string
		tls     bool
		origins []string
		policy  *origin.Policy
		want    origin.Verdict
	}{
		{"no origin", "node:8080", false, nil, p, origin.None},
		{"no origin, nil policy", "node:8080", false, nil, nil, origin.None},
		{"same origin", "node:8080", false, []string{"http://node:8080"}, p, origin.Same},
		{"same origin, nil policy", "node:8080", false, []string{"http://node:8080"}, nil, origin.Same},
		{"same origin, case", "Node:8080", false, []string{"http://NODE:8080"}, nil, origin.Same},
		{"same origin behind a TLS proxy", "node.example.com", false, []string{"https://node.example.com"}, nil, origin.Same},
		{"same origin, explicit default port in Host", "node.example.com:443", false, []string{"https://node.example.com"}, nil, origin.Same},
		{"default port of the other scheme", "node.example.com:80", false, []string{"https://node.example.com"}, nil, origin.Refused},
		{"same host, other port", "node:8080", false, []string{"http://node:8081"}, nil, origin.Refused},
		{"same origin over TLS", "node:8443", true, []string{"https://node:8443"}, nil, origin.Same},
		{"http page is not the TLS node's", "node:8443", true, []string{"http://node:8443"}, nil, origin.Refused},
		{"IPv6 same origin", "[::1]:8080", false, []string{"http://[::1]:8080"}, nil, origin.Same},
		{"listed", "node:8080", false, []string{"https://app.example.com"}, p, origin.Allowed},
		{"listed, explicit default port", "node:8080", false, []string{"https://app.example.com:443"}, p, origin.Allowed},
		{"listed, case", "node:8080", false, []string{"https://APP.example.com"}, p, origin.Allowed},
		{"listed with spaces", "node:8080", false, []string{"http://localhost:3000"}, p, origin.Allowed},
		{"listed IPv6, scheme case", "node:8080", false, []string{"http://[::1]:5173"}, p, origin.Allowed},
		{"listed, other scheme", "node:8080", false, []string{"http://app.example.com"}, p, origin.Refused},
		{"listed, other port", "node:8080", false, []string{"https://app.example.com:8443"}, p, origin.Refused},
		{"listed host as a prefix", "node:8080", false, []string{"https://app.example.com.evil.com"}, p, origin.Refused},
		{"not listed, nil policy", "node:8080", false, []string{"https://app.example.com"}, nil, origin.Refused},
		{"wildcard, one label", "node:8080", false, []string{"https://a.example.org"}, p, origin.Allowed},
		{"wildcard, two labels", "node:8080", false, []string{"https://a.b.example.org"}, p, origin.Allowed},
		{"wildcard excludes the domain itself", "node:8080", false, []string{"https://example.org"}, p, origin.Refused},
		{"wildcard needs the dot", "node:8080", false, []string{"https://evilexample.org"}, p, origin.Refused},
		{"wildcard, other scheme", "node:8080", false, []string{"http://a.example.org"}, p, origin.Refused},
		{"wildcard, other port", "node:8080", false, []string{"https://a.example.org:8443"}, p, origin.Refused},
		{"wildcard with port", "node:8080", false, []string{"https://x.corp.example.net:8443"}, p, origin.Allowed},
		{"wildcard with port, default port", "node:8080", false, []string{"https://x.corp.example.net"}, p, origin.Refused},
		{"null", "node:8080", false, []string{"null"}, p, origin.Refused},
		{"empty", "node:8080", false, []string{""}, p, origin.Refused},
		{"garbage", "node:8080", false, []string{"::nonsense"}, p, origin.Refused},
		{"path", "node:8080", false, []string{"https://app.example.com/x"}, p, origin.Refused},
		{"two Origin headers", "node:8080", false, []string{"https://app.example.com", "https://app.example.com"}, p, origin.Refused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, o := tc.policy.Check(req(tc.host, tc.tls, tc.origins...))
			if got != tc.want {
				t.Errorf("Check(Host %s, Origin %q) = %v, want %v", tc.host, tc.origins, got, tc.want)
			}
			if len(tc.origins) == 1 && o != tc.origins[0] {
				t.Errorf("origin %q, want %q", o, tc.origins[0])
			}
		})
	}
}

func TestAny(t *testing.T) {
	p, err := origin.Parse([]string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Any() {
		t.Error("Any() = false")
	}
	for o, want := range map[string]origin.Verdict{
		"https://anything.example": origin.Allowed,
		"null":                     origin.Allowed,
		"http://node:8080":         origin.Same,
		"":                         origin.Refused,
	} {
		if got, _ := p.Check(req("node:8080", false, o)); got != want {
			t.Errorf("Check(%q) = %v, want %v", o, got, want)
		}
	}
	if got, _ := p.Check(req("node:8080", false)); got != origin.None {
		t.Errorf("no Origin: %v, want none", got)
	}
}

func TestParseErrors(t *testing.T) {
	for _, e := range []string{
		"null",
		"app.example.com",
		"ftp://app.example.com",
		"https://",
		"https://app.example.com/",
		"https://app.example.com/path",
		"https://app.example.com?x=1",
		"https://app.example.com#f",
		"https://user@app.example.com",
		"https://app.example.com:",
		"https://*.com",
		"https://*",
		"https://a.*.example.com",
		"https://app*.example.com",
		"https://*.*.example.com",
		"*.example.com",
		"https://*.example.com:*",
	} {
		p, err := origin.Parse([]string{"https://ok.example.com", e})
		if err == nil {
			t.Errorf("Parse(%q) = %v, want an error", e, p)
			continue
		}
		if !strings.Contains(err.Error(), e) {
			t.Errorf("Parse(%q): %v does not name the entry", e, err)
		}
	}
}

func TestParseEmpty(t *testing.T) {
	p, err := origin.Parse([]string{"", " "})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := p.Check(req("node:8080", false, "https://app.example.com")); got != origin.Refused {
		t.Errorf("empty list: %v, want refused", got)
	}
	if got, _ := p.Check(req("node:8080", false, "http://node:8080")); got != origin.Same {
		t.Errorf("empty list, own origin: %v, want same", got)
	}
}

func TestRefusal(t *testing.T) {
	e := origin.Refusal("https://evil.example")
	if e.Status != http.StatusForbidden || e.Code != "origin_not_allowed" || !strings.Contains(e.Message, "https://evil.example") {
		t.Errorf("Refusal = %+v", e)
	}
	if e := origin.Refusal(strings.Repeat("x", 5000)); len(e.Message) > 400 {
		t.Errorf("a long origin is not cut: %d bytes", len(e.Message))
	}
}

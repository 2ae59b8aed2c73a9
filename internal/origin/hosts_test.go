package origin_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/presenced/presenced/internal/origin"
)

func TestHosts(t *testing.T) {
	list := []string{"presence.example.com", " *.App.Example.NET. ", "10.1.2.3", ""}
	for _, tc := range []struct {
		name string
		cfg  origin.HostConfig
		ok   []string
		bad  []string
		desc string
	}{
		{"no list, not local: any", origin.HostConfig{Listen: []string{":8080"}},
			[]string{"evil.example:8080", "anything", ""}, nil, "any"},
		{"*", origin.HostConfig{Allowed: []string{"*"}, Local: true},
			[]string{"evil.example:8080"}, nil, "any"},
		{"local: loopback, localhost, IP addresses, the listen host", origin.HostConfig{Local: true, Listen: []string{"127.0.0.1:8080", "devbox.lan:8081"}},
			[]string{"127.0.0.1:8080", "127.0.0.1", "[::1]:8080", "::1", "localhost:8080", "LOCALHOST", "localhost.", "192.168.1.5:8080", "[fe80::1]:80", "devbox.lan:8080", "DevBox.Lan."},
			[]string{"evil.example:8080", "evil.example", "localhost.evil.example", "127.0.0.1.nip.io:8080", "devbox.lan.evil.example", "", ":8080", "x"},
			"IP addresses, localhost, devbox.lan"},
		{"local with a list", origin.HostConfig{Local: true, Allowed: list},
			[]string{"presence.example.com:443", "PRESENCE.example.com.", "a.app.example.net", "a.b.app.example.net:8080", "10.1.2.3", "127.0.0.1"},
			[]string{"app.example.net", "example.com", "xpresence.example.com", "presence.example.com.evil", "evil.example"},
			"IP addresses, localhost, presence.example.com, *.app.example.net"},
		{"a list, not local", origin.HostConfig{Allowed: list, Listen: []string{":8080"}},
			[]string{"presence.example.com", "x.app.example.net", "10.0.0.7:8080", "localhost:8080"},
			[]string{"evil.example:8080", "app.example.net"},
			"IP addresses, localhost, presence.example.com, *.app.example.net"},
	} {
		h, err := origin.NewHosts(tc.cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, host := range tc.ok {
			if e := h.Check(&http.Request{Host: host}); e != nil {
				t.Errorf("%s: Host %q refused: %v", tc.name, host, e)
			}
		}
		for _, host := range tc.bad {
			e := h.Check(&http.Request{Host: host})
			if e == nil || e.Status != http.StatusMisdirectedRequest || e.Code != "host_not_allowed" {
				t.Errorf("%s: Host %q: got %v, want 421 host_not_allowed", tc.name, host, e)
			}
		}
		if got := h.String(); got != tc.desc {
			t.Errorf("%s: String() = %q, want %q", tc.name, got, tc.desc)
		}
	}
	var none *origin.Hosts
	if none.Check(&http.Request{Host: "evil.example"}) != nil || !none.Any() {
		t.Error("the nil Hosts refused a Host")
	}
}

func TestHostEntries(t *testing.T) {
	for _, bad := range []struct{ entry, want string }{
		{"https://presence.example.com", "without scheme"},
		{"presence.example.com:443", "no port"},
		{"presence.example.com/", "without scheme, path or port"},
		{"*.com", "two labels"},
		{"app.*.example.com", "first label"},
		{"*example.com", "first label"},
		{"a..example.com", "empty label"},
		{"user@host", "without scheme"},
	} {
		_, err := origin.NewHosts(origin.HostConfig{Allowed: []string{bad.entry}})
		if err == nil || !strings.Contains(err.Error(), bad.want) || !strings.Contains(err.Error(), bad.entry) {
			t.Errorf("entry %q: got %v, want an error naming it and saying %q", bad.entry, err, bad.want)
		}
	}
	for _, good := range []string{"[::1]", "::1", "10.0.0.1", "x", "*.example.com", "XN--BCHER-KVA.example."} {
		if _, err := origin.NewHosts(origin.HostConfig{Allowed: []string{good}}); err != nil {
			t.Errorf("entry %q: %v", good, err)
		}
	}
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "127.1.2.3:80": true, "[::1]:8080": true, "localhost:8080": true,
		":8080": false, "0.0.0.0:8080": false, "[::]:8080": false, "10.0.0.1:8080": false, "node:8080": false, "garbage": false,
	} {
		if got := origin.Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

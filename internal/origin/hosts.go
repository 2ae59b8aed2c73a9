package origin

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/presenced/presenced/internal/apierr"
)

// Hosts says which Host names a node answers to: the defence against DNS
// rebinding. A page at http://evil.example:8080 whose name the attacker
// then points at 127.0.0.1 (or a LAN address) is, to the browser, the
// same origin as the node behind that address: it sends Origin and Host
// both evil.example:8080, which the origin check takes for the node's own
// page, and reads the answers. Only the Host tells such a request apart:
// it names the attacker's domain, not one of the node's.
//
// The rules:
//
//   - An IP address (127.0.0.1, [::1], 10.0.0.5) and "localhost" are
//     always taken: a browser resolves neither through DNS, so no page
//     can rebind them. Probes and scrapers that send a pod's address
//     pass.
//   - A node that is local — under -dev (no credentials needed), or
//     listening on a loopback address — takes besides only the host of
//     its listen addresses and the names of -allowed-hosts.
//   - Any other node takes what -allowed-hosts lists, and every Host when
//     the list is empty (a node behind a proxy that forwards the public
//     name, as before).
//   - An -allowed-hosts entry is a host name (presence.example.com), a
//     wildcard of the names below a domain of two labels or more
//     (*.example.com, not example.com itself), an IP address (always
//     taken anyway), or * (every Host, the check off). Case and a
//     trailing dot do not matter; an entry has no port, scheme or path.
//
// A Host refused is answered 421 host_not_allowed (Refusal) before
// anything else is looked at. The port of the Host does not matter: a
// rebound page uses the node's own.
type Hosts struct {
	any   bool
	names map[string]bool // lower case, no trailing dot
	wild  []string        // ".example.com"
	desc  string          // for String
}

// HostConfig is what decides a node's Hosts.
type HostConfig struct {
	// Allowed are the entries of -allowed-hosts.
	Allowed []string
	// Local: the node runs under -dev or listens on a loopback address
	// only (Loopback): a list applies even when Allowed is empty.
	Local bool
	// Listen are the node's listen addresses (host:port, or :port); the
	// host of each is taken.
	Listen []string
}

// NewHosts returns the Hosts of c. An entry of c.Allowed that is no host
// name is an error naming it.
func NewHosts(c HostConfig) (*Hosts, error) {
	h := &Hosts{names: make(map[string]bool)}
	var given []string
	for _, e := range c.Allowed {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		given = append(given, e)
		if e == "*" {
			h.any = true
			continue
		}
		name, err := parseHostEntry(e)
		if err != nil {
			return nil, fmt.Errorf("host %q: %v", e, err)
		}
		if rest, ok := strings.CutPrefix(name, "*."); ok {
			h.wild = append(h.wild, "."+rest)
		} else {
			h.names[name] = true
		}
	}
	if h.any || (!c.Local && len(given) == 0) {
		h.any = true
		h.desc = "any"
		return h, nil
	}
	for _, l := range c.Listen {
		host, _, err := net.SplitHostPort(l)
		if err != nil {
			host = l
		}
		if name := normalHost(host); name != "" {
			h.names[name] = true
		}
	}
	names := []string{"IP addresses", "localhost"}
	for n := range h.names {
		if _, err := netip.ParseAddr(n); err != nil && n != "localhost" {
			names = append(names, n)
		}
	}
	slices.Sort(names[2:])
	for _, w := range h.wild {
		names = append(names, "*"+w)
	}
	h.desc = strings.Join(names, ", ")
	return h, nil
}

// parseHostEntry checks one -allowed-hosts entry and returns it in the
// form Check compares.
func parseHostEntry(e string) (string, error) {
	if strings.Contains(e, "://") || strings.ContainsAny(e, "/?#@ ") {
		return "", errors.New("want a host name (presence.example.com) or *.domain, without scheme, path or port")
	}
	if _, err := netip.ParseAddr(strings.Trim(e, "[]")); err == nil {
		return normalHost(e), nil
	}
	if strings.Contains(e, ":") {
		return "", errors.New("a host name has no port here (the port of a request does not matter)")
	}
	name := normalHost(e)
	rest, wild := strings.CutPrefix(name, "*.")
	if strings.Contains(rest, "*") {
		return "", errors.New("a wildcard stands only as the whole first label (*.example.com)")
	}
	if wild && !strings.Contains(rest, ".") {
		return "", errors.New("the wildcard needs a domain of two labels or more under it (*.example.com)")
	}
	for _, label := range strings.Split(rest, ".") {
		if label == "" {
			return "", errors.New("an empty label")
		}
	}
	return name, nil
}

// normalHost is host as Check compares it: lower case, without brackets
// around an IPv6 address or a trailing dot.
func normalHost(host string) string {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// Loopback reports whether the listen address addr (host:port) is a
// loopback address or localhost only: a node that listens there is local.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// Any reports whether every Host is taken.
func (h *Hosts) Any() bool { return h == nil || h.any }

// String says what h takes ("any", or "IP addresses, localhost,
// presence.example.com, *.example.com"), for the log.
func (h *Hosts) String() string {
	if h == nil {
		return "any"
	}
	return h.desc
}

// Check returns nil if r's Host is one h takes, else the refusal to answer.
// The nil Hosts takes every Host.
func (h *Hosts) Check(r *http.Request) *apierr.Error {
	if h.Any() {
		return nil
	}
	host := r.Host
	if sh, _, err := net.SplitHostPort(host); err == nil {
		host = sh
	}
	name := normalHost(host)
	switch {
	case name == "":
	case name == "localhost", h.names[name]:
		return nil
	default:
		if _, err := netip.ParseAddr(name); err == nil {
			return nil
		}
		for _, w := range h.wild {
			if len(name) > len(w) && strings.HasSuffix(name, w) {
				return nil
			}
		}
	}
	return hostRefusal(r.Host)
}

// hostRefusal is the answer to a request for a Host the node does not
// take: 421 host_not_allowed.
func hostRefusal(host string) *apierr.Error {
	if len(host) > 200 {
		host = host[:200] + "…"
	}
	return apierr.New(http.StatusMisdirectedRequest, "host_not_allowed",
		"this node does not answer to the Host %q: it takes IP addresses, localhost and the names of -allowed-hosts (a page whose name was pointed at this node's address is refused)", host)
}

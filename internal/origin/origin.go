// Package origin decides which browser pages may call the node, from the
// Origin header browsers send (RFC 6454): the node's own pages always, the
// pages of the origins an operator lists (-allowed-origins), and no other.
// Requests without an Origin header — backends, curl, native clients — are
// not a browser page's and pass. Policy holds the list; Check says none,
// same, allowed or refused; Refusal is the 403 origin_not_allowed both
// edges answer.
//
// The node's own origin is only as good as the Host: a page whose name was
// pointed at the node's address (DNS rebinding) sends a Host of that name.
// Hosts (hosts.go) says which Host names a node answers to at all.
//
// The rules of entries, wildcards, ports and "null" are in
// docs/protocol.md ("Origins"); the Host rule in docs/operations.md ("TLS
// and browser origins").
package origin

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/presenced/presenced/internal/apierr"
)

// Verdict is how a request's Origin stands.
type Verdict uint8

// Verdicts of Check.
const (
	None    Verdict = iota // no Origin header: not a browser page's cross-origin call
	Same                   // a page of the node itself
	Allowed                // a page of another origin the list allows
	Refused                // a page of any other origin
)

func (v Verdict) String() string {
	switch v {
	case None:
		return "none"
	case Same:
		return "same"
	case Allowed:
		return "allowed"
	}
	return "refused"
}

// Policy is a parsed list of allowed origins. The nil Policy, like an
// empty list, allows the node's own origin only. It is safe for
// concurrent use (it never changes after Parse).
type Policy struct {
	any   bool
	exact map[string]bool // "scheme://host:port", lower case
	wild  []wildcard
	list  []string // as given, for String
}

type wildcard struct {
	scheme, suffix, port string // suffix: ".example.com"
}

// Parse parses the entries of -allowed-origins (one origin each; empty
// ones are skipped). An entry that is not an origin is an error naming it.
func Parse(entries []string) (*Policy, error) {
	p := &Policy{exact: make(map[string]bool)}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		p.list = append(p.list, e)
		if e == "*" {
			p.any = true
			continue
		}
		if strings.EqualFold(e, "null") {
			return nil, fmt.Errorf("origin %q: every sandboxed frame and file: page sends null; it cannot be allowed on its own (\"*\" allows every origin)", e)
		}
		scheme, host, port, err := split(e)
		if err != nil {
			return nil, fmt.Errorf("origin %q: %v", e, err)
		}
		if rest, ok := strings.CutPrefix(host, "*."); ok {
			if strings.Contains(rest, "*") {
				return nil, fmt.Errorf("origin %q: one wildcard only, as the first label (https://*.example.com)", e)
			}
			if !strings.Contains(rest, ".") {
				return nil, fmt.Errorf("origin %q: the wildcard needs a domain of two labels or more under it (https://*.example.com)", e)
			}
			p.wild = append(p.wild, wildcard{scheme: scheme, suffix: "." + rest, port: port})
			continue
		}
		if strings.Contains(host, "*") {
			return nil, fmt.Errorf("origin %q: a wildcard stands only as the whole first label (https://*.example.com)", e)
		}
		p.exact[key(scheme, host, port)] = true
	}
	return p, nil
}

// split parses an origin, scheme://host[:port], into its lower-case scheme,
// host and port (the scheme's default when missing).
func split(s string) (scheme, host, port string, err error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", "", "", errors.New("not a URL")
	}
	scheme = strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		return "", "", "", errors.New("want http://host[:port] or https://host[:port]")
	}
	switch {
	case u.Opaque != "" || u.Host == "":
		return "", "", "", errors.New("no host: want scheme://host[:port]")
	case u.User != nil:
		return "", "", "", errors.New("an origin has no user part")
	case u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery || strings.HasSuffix(s, "#"):
		return "", "", "", errors.New("an origin has no path, query or fragment (not even a trailing /)")
	}
	host = strings.ToLower(u.Hostname())
	port = u.Port()
	if host == "" {
		return "", "", "", errors.New("no host")
	}
	if strings.HasSuffix(u.Host, ":") {
		return "", "", "", errors.New("empty port")
	}
	if port == "" {
		port = defaultPort(scheme)
	}
	return scheme, host, port, nil
}

func defaultPort(scheme string) string {
	if scheme == "https" {
		return "443"
	}
	return "80"
}

func key(scheme, host, port string) string {
	return scheme + "://" + net.JoinHostPort(host, port)
}

// String is the list as given, comma-separated; empty: the node's own
// origin only.
func (p *Policy) String() string {
	if p == nil {
		return ""
	}
	return strings.Join(p.list, ",")
}

// Any reports whether every origin is allowed ("*").
func (p *Policy) Any() bool { return p != nil && p.any }

// Check returns how r's Origin stands, and the Origin as sent.
func (p *Policy) Check(r *http.Request) (Verdict, string) {
	vs := r.Header.Values("Origin")
	switch len(vs) {
	case 0:
		return None, ""
	case 1:
	default:
		return Refused, strings.Join(vs, ", ") // a browser sends one
	}
	o := vs[0]
	if o == "" {
		return Refused, o
	}
	if p.Any() {
		if same(o, r) {
			return Same, o
		}
		return Allowed, o
	}
	scheme, host, port, err := split(o)
	if err != nil {
		return Refused, o // "null", garbage
	}
	if sameParsed(scheme, host, port, r) {
		return Same, o
	}
	if p == nil {
		return Refused, o
	}
	if p.exact[key(scheme, host, port)] {
		return Allowed, o
	}
	for _, w := range p.wild {
		if w.scheme == scheme && w.port == port && len(host) > len(w.suffix) && strings.HasSuffix(host, w.suffix) {
			return Allowed, o
		}
	}
	return Refused, o
}

func same(o string, r *http.Request) bool {
	scheme, host, port, err := split(o)
	return err == nil && sameParsed(scheme, host, port, r)
}

// sameParsed reports whether the origin is the node's own: the Host the
// request was sent to, with the Origin's scheme (only https when the node
// serves TLS itself).
func sameParsed(scheme, host, port string, r *http.Request) bool {
	if r.TLS != nil && scheme != "https" {
		return false
	}
	h, hp := r.Host, ""
	if sh, sp, err := net.SplitHostPort(h); err == nil {
		h, hp = sh, sp
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if hp == "" {
		hp = defaultPort(scheme)
	}
	return h != "" && strings.EqualFold(h, host) && hp == port
}

// Refusal is the answer to a page of a refused origin: 403
// origin_not_allowed.
func Refusal(o string) *apierr.Error {
	if len(o) > 200 {
		o = o[:200] + "…"
	}
	return apierr.New(http.StatusForbidden, "origin_not_allowed",
		"pages of origin %q may not call this node: it takes its own origin and those of -allowed-origins", o)
}

package tlscert_test

import (
	"bytes"
	"crypto/tls"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/presenced/presenced/internal/tlscert"
	"github.com/presenced/presenced/internal/tlscert/tlstest"
)

// serve runs a TLS echo-less server with s's configuration and returns its
// address; each connection is closed after its handshake.
func serve(t *testing.T, s *tlscert.Store) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", s.Config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = c.(*tls.Conn).Handshake()
				_, _ = io.Copy(io.Discard, c)
				c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

// handshake connects to addr and returns the serial of the certificate
// the server presents.
func handshake(t *testing.T, ca *tlstest.CA, addr string) (int64, *tls.Conn) {
	t.Helper()
	c, err := tls.Dial("tcp", addr, ca.ClientConfig())
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return tlstest.Serial(c.ConnectionState()), c
}

// TestReload: a reload serves the new pair to new handshakes; a bad new
// pair keeps the one in use, and says why.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t)
	certFile, keyFile := ca.Issue(t, dir, "live", 2)
	var logs bytes.Buffer
	s, err := tlscert.Load(certFile, keyFile, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, s)
	if got, _ := handshake(t, ca, addr); got != 2 {
		t.Fatalf("serial %d, want 2", got)
	}
	_, old := handshake(t, ca, addr)

	// Renewed: serial 3.
	c3, k3 := ca.Issue(t, dir, "next", 3)
	tlstest.Replace(t, c3, certFile)
	tlstest.Replace(t, k3, keyFile)
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if got, _ := handshake(t, ca, addr); got != 3 {
		t.Fatalf("after the reload: serial %d, want 3", got)
	}
	if got := s.Certificate().Leaf.SerialNumber.Int64(); got != 3 {
		t.Errorf("Certificate(): serial %d, want 3", got)
	}
	if got := tlstest.Serial(old.ConnectionState()); got != 2 {
		t.Errorf("an open connection's certificate changed to %d", got)
	}
	if !strings.Contains(logs.String(), "TLS certificate reloaded") {
		t.Errorf("no reload logged:\n%s", logs.String())
	}

	// Bad pairs: each keeps serial 3.
	c4, _ := ca.Issue(t, dir, "other", 4)
	for _, tc := range []struct {
		name  string
		setup func()
		want  string
	}{
		{"key of another certificate", func() { tlstest.Replace(t, c4, certFile) }, "private key does not match public key"},
		{"half-written certificate", func() {
			b, _ := os.ReadFile(c3)
			_ = os.WriteFile(certFile, b[:len(b)/2], 0o600)
		}, certFile},
		{"missing key", func() { tlstest.Replace(t, c3, certFile); os.Remove(keyFile) }, "no such file"},
	} {
		logs.Reset()
		tc.setup()
		err := s.Reload()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Reload() = %v, want an error with %q", tc.name, err, tc.want)
		}
		if got, _ := handshake(t, ca, addr); got != 3 {
			t.Errorf("%s: serial %d, want 3 (the pair in use)", tc.name, got)
		}
		if !strings.Contains(logs.String(), "keeping the one in use") {
			t.Errorf("%s: the refusal is not logged:\n%s", tc.name, logs.String())
		}
	}
}

// TestLoadErrors: a pair that does not load is refused at start with a
// message naming the files and the reason.
func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t)
	certFile, keyFile := ca.Issue(t, dir, "a", 2)
	otherCert, otherKey := ca.Issue(t, dir, "b", 3)
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, cert, key string
		want            []string
	}{
		{"mismatched key", certFile, otherKey, []string{certFile, otherKey, "private key does not match public key"}},
		{"key given as certificate", keyFile, keyFile, []string{keyFile, "certificate"}},
		{"garbage certificate", garbage, keyFile, []string{garbage, "failed to find any PEM data"}},
		{"missing certificate", filepath.Join(dir, "none.crt"), keyFile, []string{"none.crt", "no such file"}},
		{"missing key", otherCert, filepath.Join(dir, "none.key"), []string{"none.key", "no such file"}},
		{"no key file given", certFile, "", []string{"both"}},
	} {
		_, err := tlscert.Load(tc.cert, tc.key, nil)
		if err == nil {
			t.Errorf("%s: loaded", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v lacks %q", tc.name, err, w)
			}
		}
	}
}

// TestConfig: TLS 1.2 at least and HTTP/1.1 only.
func TestConfig(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t)
	certFile, keyFile := ca.Issue(t, dir, "a", 2)
	s, err := tlscert.Load(certFile, keyFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, s)
	cfg := ca.ClientConfig()
	cfg.MaxVersion = tls.VersionTLS11
	cfg.MinVersion = tls.VersionTLS10
	if c, err := tls.Dial("tcp", addr, cfg); err == nil {
		c.Close()
		t.Error("a TLS 1.1 handshake succeeded")
	}
	cfg = ca.ClientConfig()
	cfg.NextProtos = []string{"h2", "http/1.1"}
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p := c.ConnectionState().NegotiatedProtocol; p != "http/1.1" {
		t.Errorf("negotiated %q, want http/1.1", p)
	}
}

// Package tlscert serves a node's TLS certificate from a certificate file
// and a key file (-tls-cert, -tls-key), and loads them again on demand —
// on SIGHUP, when a renewal tool has replaced them — without a restart: new
// handshakes present the new certificate, open connections keep theirs. A
// pair that does not load (a file missing or half-written, a key that is
// not the certificate's) leaves the one in use in place.
package tlscert

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Store holds the certificate in use. It is safe for concurrent use.
type Store struct {
	certFile, keyFile string
	log               *slog.Logger
	now               func() time.Time

	cur      atomic.Pointer[tls.Certificate]
	reloadMu sync.Mutex // serializes Reload
}

// Load reads the pair. Its error says which files and why; an expired
// certificate loads (with a warning), as it is better than none while a
// renewal is under way.
func Load(certFile, keyFile string, log *slog.Logger) (*Store, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("tlscert: both a certificate file and a key file are needed")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{certFile: certFile, keyFile: keyFile, log: log, now: time.Now}
	c, err := s.load()
	if err != nil {
		return nil, err
	}
	s.cur.Store(c)
	s.warnValidity(c)
	return s, nil
}

// load reads and checks the pair.
func (s *Store) load() (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
	if err != nil {
		return nil, fmt.Errorf("TLS certificate %s with key %s: %w", s.certFile, s.keyFile, err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, fmt.Errorf("TLS certificate %s: %w", s.certFile, err)
		}
	}
	return &c, nil
}

func (s *Store) warnValidity(c *tls.Certificate) {
	now := s.now()
	switch {
	case now.After(c.Leaf.NotAfter):
		s.log.Warn("the TLS certificate has expired: clients will refuse it", "file", s.certFile, "not_after", c.Leaf.NotAfter)
	case now.Before(c.Leaf.NotBefore):
		s.log.Warn("the TLS certificate is not valid yet: clients will refuse it", "file", s.certFile, "not_before", c.Leaf.NotBefore)
	}
}

// Reload reads the files again and, if they make a good pair, serves it to
// every new handshake. Otherwise the certificate in use stays and the
// error says why. It logs either way.
func (s *Store) Reload() error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	c, err := s.load()
	if err != nil {
		s.log.Error("TLS certificate not reloaded: keeping the one in use", "err", err,
			"serving_not_after", s.cur.Load().Leaf.NotAfter)
		return err
	}
	s.cur.Store(c)
	s.log.Info("TLS certificate reloaded", "subject", c.Leaf.Subject.String(), "serial", c.Leaf.SerialNumber.String(),
		"not_after", c.Leaf.NotAfter)
	s.warnValidity(c)
	return nil
}

// Certificate is the certificate in use (its Leaf is set).
func (s *Store) Certificate() *tls.Certificate { return s.cur.Load() }

// GetCertificate is tls.Config.GetCertificate: the certificate in use.
func (s *Store) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cur.Load(), nil
}

// Config is the server configuration of the node's clients' listener:
// TLS 1.2 or later, the certificate in use, and HTTP/1.1 only (a
// WebSocket upgrade needs it, and the connection caps count HTTP/1.1
// connections).
func (s *Store) Config() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: s.GetCertificate,
		NextProtos:     []string{"http/1.1"},
	}
}

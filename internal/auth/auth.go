// Package auth tells who is calling: an app backend proving itself with the
// API key, a client proving its user with an HS256 JWT, or — only under the
// explicit development mode — anybody at all.
package auth

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/presence"
)

// Kind is the kind of caller.
type Kind uint8

// Kinds of callers.
const (
	Anonymous Kind = iota // no credentials; accepted only in development mode
	Backend               // holds the API key; may act for any user
	Client                // holds a user's token; may act only for that user
)

// Principal is an authenticated caller.
type Principal struct {
	Kind   Kind
	UserID string // Client: the token's subject
	Device string // Client: the token's optional device claim
}

// Errors callers branch on. Both mean 401.
var (
	ErrMissing = errors.New("missing credentials: send Authorization: Bearer <api key or token>")
	ErrInvalid = errors.New("invalid credentials")
)

// Config configures an Authenticator.
type Config struct {
	APIKey    string      // the backends' key; empty: no backend can authenticate
	JWTSecret []byte      // the HS256 secret of client tokens; empty: no client can
	Dev       bool        // accept requests without credentials as Anonymous
	Clock     clock.Clock // for token expiry; default the wall clock
	// Leeway tolerates clock skew on exp/nbf/iat. Default 30s.
	Leeway time.Duration
}

// Authenticator checks credentials. It is safe for concurrent use.
type Authenticator struct {
	apiKey []byte
	secret []byte
	dev    bool
	parser *jwt.Parser
}

// New returns an Authenticator.
func New(cfg Config) *Authenticator {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Leeway <= 0 {
		cfg.Leeway = 30 * time.Second
	}
	return &Authenticator{
		apiKey: []byte(cfg.APIKey),
		secret: cfg.JWTSecret,
		dev:    cfg.Dev,
		parser: jwt.NewParser(
			jwt.WithValidMethods([]string{"HS256"}),
			jwt.WithTimeFunc(cfg.Clock.Now),
			jwt.WithLeeway(cfg.Leeway),
			jwt.WithExpirationRequired(), // a token that never expires is never revocable
		),
	}
}

// Dev reports whether development mode is on.
func (a *Authenticator) Dev() bool { return a.dev }

// Request authenticates an HTTP request by its Authorization header.
func (a *Authenticator) Request(r *http.Request) (Principal, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return a.Credential("")
	}
	// The scheme name is case-insensitive (RFC 7235 §2.1).
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return Principal{}, fmt.Errorf("%w: Authorization must be \"Bearer <api key or token>\"", ErrInvalid)
	}
	return a.Credential(strings.TrimSpace(tok))
}

// Credential authenticates a bearer credential: the API key or a token.
// An empty credential is Anonymous in development mode and ErrMissing
// otherwise.
func (a *Authenticator) Credential(cred string) (Principal, error) {
	if cred == "" {
		if a.dev {
			return Principal{Kind: Anonymous}, nil
		}
		return Principal{}, ErrMissing
	}
	if len(a.apiKey) > 0 && subtle.ConstantTimeCompare([]byte(cred), a.apiKey) == 1 {
		return Principal{Kind: Backend}, nil
	}
	if len(a.secret) == 0 || strings.Count(cred, ".") != 2 {
		return Principal{}, ErrInvalid
	}
	var c claims
	_, err := a.parser.ParseWithClaims(cred, &c, func(*jwt.Token) (any, error) { return a.secret, nil })
	if err != nil {
		return Principal{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := presence.ValidateID(c.Subject); err != nil {
		return Principal{}, fmt.Errorf("%w: token subject: %v", ErrInvalid, err)
	}
	if c.Device != "" {
		if err := presence.ValidateID(c.Device); err != nil {
			return Principal{}, fmt.Errorf("%w: token device: %v", ErrInvalid, err)
		}
	}
	return Principal{Kind: Client, UserID: c.Subject, Device: c.Device}, nil
}

type claims struct {
	jwt.RegisteredClaims
	Device string `json:"device,omitempty"`
}

// Sign returns an HS256 token for user (and optionally one device) that
// expires after ttl. Backends do this in their own language; Sign serves
// tests, tools and the -print-token flag.
func Sign(secret []byte, user, device string, now time.Time, ttl time.Duration) (string, error) {
	if ttl <= 0 {
		return "", errors.New("auth: a token needs a positive lifetime (tokens without exp are refused)")
	}
	c := claims{Device: device}
	c.Subject = user
	c.IssuedAt = jwt.NewNumericDate(now)
	c.ExpiresAt = jwt.NewNumericDate(now.Add(ttl))
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
}

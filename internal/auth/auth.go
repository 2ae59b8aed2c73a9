// Package auth tells who is calling: an app backend proving itself with the
// API key, a client proving its user with an HS256 JWT, or — only under the
// explicit development mode — anybody at all.
//
// A client token is accepted only if it is HS256 with the configured
// secret, carries a valid subject and an exp, is within its exp and nbf
// (give or take the leeway), was not issued (iat) later than now plus the
// leeway, expires no later than MaxLifetime after now and — when it
// carries iat — no later than MaxLifetime after its iat, has the
// configured audience and issuer when those are set, and has no crit
// header (this server understands no extensions, RFC 7515 §4.1.11).
//
// Its header and claims are decoded by the rule of every JSON object the
// node takes from outside (package strictjson): names exact ("SUB" is not
// "sub", "Exp" not "exp"), none given twice, times as JSON numbers (not
// strings of digits). Claims the node does not know are ignored: tokens
// carry the app's own.
//
// A client token may carry the rooms its user may join and watch:
// "rooms":["doc-42","team-7-*"], each a room id, a prefix followed by one
// trailing "*", or "*" alone (every room). A bad rooms claim makes the
// whole token invalid (ParseRooms says why); without one, no room.
package auth

import (
	"bytes"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/strictjson"
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
	// Expires is when a Client's token expires (its exp); zero for the
	// other kinds, whose credentials do not expire. A WebSocket opened
	// with the token is closed then.
	Expires time.Time
	// Rooms are a Client's rooms claim, parsed; nil without one (or with
	// an empty one). They are immutable, so Principals share them.
	Rooms *Rooms
}

// Errors callers branch on. Both mean 401.
var (
	ErrMissing = errors.New("missing credentials: send Authorization: Bearer <api key or token>")
	ErrInvalid = errors.New("invalid credentials")
)

// DefaultMaxLifetime is the longest a client token may be valid for,
// unless Config.MaxLifetime says otherwise.
const DefaultMaxLifetime = 24 * time.Hour

// MinSecretLen is the shortest API key or JWT secret, in bytes, that a
// node accepts outside development mode: HS256 needs a key at least as
// long as its hash output (RFC 7518 §3.2), and a shorter API key is
// guessable. The node (internal/app, cmd/presenced) enforces it; New does
// not, so tests may use short ones.
const MinSecretLen = 32

// placeholderWords mark a secret copied from an example instead of
// generated (the secrets.env.example files of deploy/kustomize are long
// enough to pass the length rule).
var placeholderWords = []string{"replace-me", "replace_me", "replaceme", "change-me", "change_me", "changeme", "placeholder", "example", "your-secret", "secret-here"}

// CheckSecret returns an error saying why secret (an API key or a JWT
// secret) cannot be used outside development mode — too short, or a
// placeholder from an example — or nil.
func CheckSecret(secret []byte) error {
	if len(secret) < MinSecretLen {
		return fmt.Errorf("%d bytes long; at least %d bytes are required outside -dev (e.g. openssl rand -hex 32)", len(secret), MinSecretLen)
	}
	lower := bytes.ToLower(secret)
	for _, w := range placeholderWords {
		if bytes.Contains(lower, []byte(w)) {
			return fmt.Errorf("a placeholder (it contains %q), not a secret; generate one (e.g. openssl rand -hex 32)", w)
		}
	}
	return nil
}

// Config configures an Authenticator.
type Config struct {
	APIKey    string      // the backends' key; empty: no backend can authenticate
	JWTSecret []byte      // the HS256 secret of client tokens; empty: no client can
	Dev       bool        // accept requests without credentials as Anonymous
	Clock     clock.Clock // for token expiry; default the wall clock
	// Leeway tolerates clock skew on exp/nbf/iat and on MaxLifetime
	// counted from now. Default 30s.
	Leeway time.Duration
	// MaxLifetime refuses a token whose exp is more than this after now
	// (plus Leeway, for a minter whose clock is ahead) or, when it carries
	// iat, more than this after its iat: a token good for a year is
	// refused for its whole life, not only while young. Default
	// DefaultMaxLifetime (24h).
	MaxLifetime time.Duration
	// Audience, when set, must be one of the token's aud values (a string
	// or an array of strings, RFC 7519 §4.1.3); empty: aud is not checked.
	Audience string
	// Issuer, when set, must equal the token's iss; empty: not checked.
	Issuer string
}

// Authenticator checks credentials. It is safe for concurrent use.
type Authenticator struct {
	apiKey      []byte
	secret      []byte
	dev         bool
	clock       clock.Clock
	leeway      time.Duration
	maxLifetime time.Duration
	audience    string
	issuer      string
	parser      *jwt.Parser
}

// New returns an Authenticator.
func New(cfg Config) *Authenticator {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Leeway <= 0 {
		cfg.Leeway = 30 * time.Second
	}
	if cfg.MaxLifetime <= 0 {
		cfg.MaxLifetime = DefaultMaxLifetime
	}
	return &Authenticator{
		apiKey:      []byte(cfg.APIKey),
		secret:      cfg.JWTSecret,
		dev:         cfg.Dev,
		clock:       cfg.Clock,
		leeway:      cfg.Leeway,
		maxLifetime: cfg.MaxLifetime,
		audience:    cfg.Audience,
		issuer:      cfg.Issuer,
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
	if err := checkHeader(cred); err != nil {
		return Principal{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	var c claims
	if _, err := a.parser.ParseWithClaims(cred, &c, func(*jwt.Token) (any, error) { return a.secret, nil }); err != nil {
		var se *strictjson.Error
		if errors.As(err, &se) {
			return Principal{}, fmt.Errorf("%w: token claims %v", ErrInvalid, se)
		}
		return Principal{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := a.checkToken(&c); err != nil {
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
	rooms, err := ParseRooms(c.Rooms)
	if err != nil {
		return Principal{}, fmt.Errorf("%w: token rooms: %v", ErrInvalid, err)
	}
	return Principal{Kind: Client, UserID: c.Subject, Device: c.Device, Expires: c.Exp.time(), Rooms: rooms}, nil
}

// header is a token's JOSE header as the node reads it: alg is checked by
// the parser, crit refused; the other parameters (kid, cty, …) pass.
type header struct {
	Alg  string          `json:"alg"`
	Typ  string          `json:"typ"`
	Crit json.RawMessage `json:"crit"`
}

// checkHeader decodes the header of cred (three segments) strictly: the
// parser reads it into a map, which would keep the last of two "alg"s.
func checkHeader(cred string) error {
	seg, _, _ := strings.Cut(cred, ".")
	b, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return errors.New("token header is not base64url without padding")
	}
	var h header
	if err := strictjson.DecodeOpen(b, &h); err != nil {
		return fmt.Errorf("token header %v", err)
	}
	if h.Crit != nil {
		return fmt.Errorf("token header crit %s: this server understands no JWS extensions", h.Crit)
	}
	return nil
}

// checkToken applies the rules the parser does not know of to a token
// whose signature, exp and nbf it has checked.
func (a *Authenticator) checkToken(c *claims) error {
	now := a.clock.Now()
	exp := c.Exp.time() // the parser requires exp
	if left := exp.Sub(now); left > a.maxLifetime+a.leeway {
		return fmt.Errorf("token expires in %s, more than the maximum token lifetime of %s", left.Round(time.Second), a.maxLifetime)
	}
	if c.Iat != nil {
		iat := c.Iat.time()
		// A token issued in the future is no token of this world, and its
		// lifetime counted from that iat would be meaningless.
		if ahead := iat.Sub(now); ahead > a.leeway {
			return fmt.Errorf("token iat is %s after now, more than the clock skew of %s allowed", ahead.Round(time.Second), a.leeway)
		}
		if life := exp.Sub(iat); life > a.maxLifetime {
			return fmt.Errorf("token lives %s from iat to exp, more than the maximum token lifetime of %s", life.Round(time.Second), a.maxLifetime)
		}
	}
	if a.audience != "" && !slices.Contains(c.Audience, a.audience) {
		return fmt.Errorf("token audience must include %q", a.audience)
	}
	if a.issuer != "" && c.Issuer != a.issuer {
		return fmt.Errorf("token issuer must be %q", a.issuer)
	}
	return nil
}

// claims are the claims of a client token the node reads. They are decoded
// by strictjson (UnmarshalJSON), claims of the app's own ignored.
type claims struct {
	Subject  string           `json:"sub"`
	Device   string           `json:"device,omitempty"`
	Issuer   string           `json:"iss,omitempty"`
	Audience jwt.ClaimStrings `json:"aud,omitempty"`
	Exp      *seconds         `json:"exp,omitempty"`
	Nbf      *seconds         `json:"nbf,omitempty"`
	Iat      *seconds         `json:"iat,omitempty"`
	Rooms    []string         `json:"rooms,omitempty"`
}

// seconds is a NumericDate (RFC 7519 §2): seconds since the epoch, a JSON
// number (a float64 takes no string), within ±2^53.
type seconds float64

func (s *seconds) time() time.Time {
	if s == nil {
		return time.Time{}
	}
	whole, frac := math.Modf(float64(*s))
	return time.Unix(int64(whole), int64(frac*1e9))
}

func (s *seconds) date() *jwt.NumericDate {
	if s == nil {
		return nil
	}
	return jwt.NewNumericDate(s.time())
}

// UnmarshalJSON decodes the claims set strictly (package strictjson).
func (c *claims) UnmarshalJSON(b []byte) error {
	type fields claims // without this method
	if err := strictjson.DecodeOpen(b, (*fields)(c)); err != nil {
		return err
	}
	for _, t := range []struct {
		name string
		v    *seconds
	}{{"exp", c.Exp}, {"nbf", c.Nbf}, {"iat", c.Iat}} {
		if t.v != nil && math.Abs(float64(*t.v)) >= 1<<53 {
			return fmt.Errorf("token claim %s %g is out of range: seconds since 1970", t.name, float64(*t.v))
		}
	}
	return nil
}

// The jwt.Claims the parser validates exp, nbf (and aud, iss: checkToken)
// with.
var _ jwt.Claims = (*claims)(nil)

func (c *claims) GetExpirationTime() (*jwt.NumericDate, error) { return c.Exp.date(), nil }
func (c *claims) GetNotBefore() (*jwt.NumericDate, error)      { return c.Nbf.date(), nil }
func (c *claims) GetIssuedAt() (*jwt.NumericDate, error)       { return c.Iat.date(), nil }
func (c *claims) GetIssuer() (string, error)                   { return c.Issuer, nil }
func (c *claims) GetSubject() (string, error)                  { return c.Subject, nil }
func (c *claims) GetAudience() (jwt.ClaimStrings, error)       { return c.Audience, nil }

// Sign returns an HS256 token for user (and optionally one device) that
// expires after ttl. Backends do this in their own language; Sign serves
// tests, tools and the -print-token flag.
func Sign(secret []byte, user, device string, now time.Time, ttl time.Duration) (string, error) {
	return Token{User: user, Device: device}.Sign(secret, now, ttl)
}

// Token is the content of a client token that Sign makes.
type Token struct {
	User     string   // sub
	Device   string   // device, optional
	Audience string   // aud, optional
	Issuer   string   // iss, optional
	Rooms    []string // rooms, optional: room ids and patterns (ParseRooms)
}

// Sign returns the HS256 token issued at now that expires after ttl.
func (t Token) Sign(secret []byte, now time.Time, ttl time.Duration) (string, error) {
	if ttl <= 0 {
		return "", errors.New("auth: a token needs a positive lifetime (tokens without exp are refused)")
	}
	if _, err := ParseRooms(t.Rooms); err != nil {
		return "", fmt.Errorf("auth: token rooms: %v", err)
	}
	iat, exp := seconds(now.Unix()), seconds(now.Add(ttl).Unix())
	c := &claims{Subject: t.User, Device: t.Device, Issuer: t.Issuer, Iat: &iat, Exp: &exp, Rooms: t.Rooms}
	if t.Audience != "" {
		c.Audience = jwt.ClaimStrings{t.Audience}
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
}

// --- what a principal may do: decided here for every entry point ---

// Denied is a request its principal may not make (HTTP 403).
type Denied struct{ Reason string }

func (d *Denied) Error() string { return d.Reason }

// ErrNoUser: neither the credentials nor the request name the user acted
// for (HTTP 400 invalid_id).
var ErrNoUser = errors.New("user_id is required")

// ActFor returns the user p acts for when a request names claimed (empty
// if it names none): a backend acts for the named user, a client for its
// own only, and the anonymous caller of development mode for the named
// user.
func (p Principal) ActFor(claimed string) (string, error) {
	if p.Kind == Client {
		if claimed != "" && claimed != p.UserID {
			return "", &Denied{"a client token may only act for its own user"}
		}
		return p.UserID, nil
	}
	if claimed == "" {
		return "", ErrNoUser
	}
	return claimed, nil
}

// ReadAs returns who p reads as when a request names the viewer claimed:
// a backend reads as anyone it names (empty: the anonymous everyone-view),
// a client as its own user only.
func (p Principal) ReadAs(claimed string) (string, error) {
	if p.Kind == Client {
		if claimed != "" && claimed != p.UserID {
			return "", &Denied{"a client token may only read as its own user"}
		}
		return p.UserID, nil
	}
	return claimed, nil
}

// Manages reports whether p may manage user's account (settings,
// contacts): a client its own only.
func (p Principal) Manages(user string) error {
	if p.Kind == Client && p.UserID != user {
		return &Denied{"a client token may only manage its own user"}
	}
	return nil
}

// AllowsRoom reports whether p may join and watch room: the API key and
// the anonymous caller of development mode every room, a client the rooms
// its token's claim matches (none without one). The room is an id that
// was validated apart.
func (p Principal) AllowsRoom(room string) bool {
	switch p.Kind {
	case Backend, Anonymous:
		return true
	case Client:
		return p.Rooms.Allows(room)
	}
	return false
}

// DeviceFor returns the device p acts as when a request names claimed: a
// client token bound to a device acts as that device only; otherwise the
// named one (empty if none).
func (p Principal) DeviceFor(claimed string) (string, error) {
	if p.Kind == Client && p.Device != "" {
		if claimed != "" && claimed != p.Device {
			return "", &Denied{"the token is bound to another device"}
		}
		return p.Device, nil
	}
	return claimed, nil
}

// MaxRoomPatterns is the most entries a token's rooms claim may hold.
const MaxRoomPatterns = 100

// Rooms are the rooms a client token lets its user join and watch: the
// parsed rooms claim. They never change once parsed and are safe for
// concurrent use; a nil *Rooms allows no room.
type Rooms struct {
	all      bool     // "*": every room
	ids      []string // rooms named exactly
	prefixes []string // of the patterns "prefix*", without the *
}

// ParseRooms parses a rooms claim: at most MaxRoomPatterns entries, each
// a room id ("doc-42"), a non-empty prefix followed by one trailing "*"
// ("team-7-*": every room whose id starts with team-7-, team-7- itself
// too), or "*" alone (every room). Ids and prefixes follow the rules of
// ids (presence.ValidateID), and a "*" anywhere but at the end is
// refused, so a room whose id holds one is named by a prefix only. A
// nil or empty claim gives nil: no room.
func ParseRooms(claim []string) (*Rooms, error) {
	if len(claim) == 0 {
		return nil, nil
	}
	if len(claim) > MaxRoomPatterns {
		return nil, fmt.Errorf("the claim holds %d entries, the limit is %d", len(claim), MaxRoomPatterns)
	}
	r := &Rooms{}
	for i, p := range claim {
		if err := checkRoomPattern(p); err != nil {
			return nil, fmt.Errorf("entry %d %s %v", i, quoteShort(p), err)
		}
		switch prefix, wild := strings.CutSuffix(p, "*"); {
		case p == "*":
			r.all = true
		case wild:
			r.prefixes = append(r.prefixes, prefix)
		default:
			r.ids = append(r.ids, p)
		}
	}
	return r, nil
}

// checkRoomPattern says why p is no entry of a rooms claim (a predicate:
// "is empty", "has a…"), or nil.
func checkRoomPattern(p string) error {
	if p == "" {
		return errors.New(`is empty: want a room id, a prefix followed by "*", or "*" alone`)
	}
	if p == "*" {
		return nil
	}
	id, wild := strings.CutSuffix(p, "*")
	if i := strings.IndexByte(id, '*'); i >= 0 {
		return fmt.Errorf(`has a "*" at byte %d: a "*" may only end a prefix ("doc-*") or stand alone ("*")`, i)
	}
	if err := presence.ValidateID(id); err != nil {
		if wild {
			return fmt.Errorf("is no prefix of room ids: %v", err)
		}
		return fmt.Errorf("is no room id: %v", err)
	}
	return nil
}

// quoteShort quotes s for an error message, cut after MaxIDLen bytes.
func quoteShort(s string) string {
	if len(s) > presence.MaxIDLen+1 {
		return fmt.Sprintf("%q… (%d bytes)", s[:presence.MaxIDLen], len(s))
	}
	return fmt.Sprintf("%q", s)
}

// Allows reports whether r lets its holder into room.
func (r *Rooms) Allows(room string) bool {
	if r == nil {
		return false
	}
	if r.all || slices.Contains(r.ids, room) {
		return true
	}
	for _, p := range r.prefixes {
		if strings.HasPrefix(room, p) {
			return true
		}
	}
	return false
}

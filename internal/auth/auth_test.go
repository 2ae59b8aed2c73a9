package auth_test

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/clock"
)

var (
	secret = []byte("auth-test-secret-of-32-bytes-ok!")
	t0     = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
)

func sign(t *testing.T, m jwt.SigningMethod, key any, c jwt.MapClaims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, c).SignedString(key)
	if err != nil {
		t.Fatalf("signing: %v", err)
	}
	return s
}

func mustSign(t *testing.T, user, device string, now time.Time, ttl time.Duration) string {
	t.Helper()
	tok, err := auth.Sign(secret, user, device, now, ttl)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return tok
}

func TestCredential(t *testing.T) {
	clk := clock.NewFake(t0)
	a := auth.New(auth.Config{APIKey: "key", JWTSecret: secret, Clock: clk})
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	good := mustSign(t, "alice", "", t0, time.Hour)
	parts := strings.Split(good, ".")
	// Another first character of the signature changes its first byte.
	badSig := []byte(parts[2])
	badSig[0] = map[bool]byte{true: 'B', false: 'A'}[badSig[0] == 'A']
	// Hand-made tokens carry a valid exp, so that each is refused for the
	// reason its case names and not for a missing exp.
	exp := t0.Add(time.Hour).Unix()
	expires := time.Unix(exp, 0)
	tests := []struct {
		name    string
		cred    string
		want    auth.Principal
		wantErr error
	}{
		{"api key", "key", auth.Principal{Kind: auth.Backend}, nil},
		{"token", good, auth.Principal{Kind: auth.Client, UserID: "alice", Expires: expires}, nil},
		{"token with device", mustSign(t, "alice", "phone", t0, time.Hour), auth.Principal{Kind: auth.Client, UserID: "alice", Device: "phone", Expires: expires}, nil},
		// A token that never expires could never be revoked.
		{"token without expiry", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "bob"}), auth.Principal{}, auth.ErrInvalid},
		{"token with iat but no exp", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "bob", "iat": t0.Unix()}), auth.Principal{}, auth.ErrInvalid},
		{"token with a null exp", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "bob", "exp": nil}), auth.Principal{}, auth.ErrInvalid},
		{"hand-made token with exp", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "bob", "exp": exp}), auth.Principal{Kind: auth.Client, UserID: "bob", Expires: expires}, nil},
		{"expired within leeway", mustSign(t, "bob", "", t0.Add(-time.Hour-20*time.Second), time.Hour), auth.Principal{Kind: auth.Client, UserID: "bob", Expires: t0.Add(-20 * time.Second)}, nil},
		{"empty", "", auth.Principal{}, auth.ErrMissing},
		{"wrong key", "kay", auth.Principal{}, auth.ErrInvalid},
		{"key prefix", "ke", auth.Principal{}, auth.ErrInvalid},
		{"key with suffix", "key1", auth.Principal{}, auth.ErrInvalid},
		{"expired", mustSign(t, "bob", "", t0.Add(-2*time.Hour), time.Hour), auth.Principal{}, auth.ErrInvalid},
		{"not yet valid", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a", "exp": exp, "nbf": t0.Add(time.Minute).Unix()}), auth.Principal{}, auth.ErrInvalid},
		{"other secret", func() string { s, _ := auth.Sign([]byte("other"), "alice", "", t0, time.Hour); return s }(), auth.Principal{}, auth.ErrInvalid},
		{"wrong signature", parts[0] + "." + parts[1] + "." + string(badSig), auth.Principal{}, auth.ErrInvalid},
		{"no signature", parts[0] + "." + parts[1] + ".", auth.Principal{}, auth.ErrInvalid},
		{"alg none", b64([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + b64(fmt.Appendf(nil, `{"sub":"alice","exp":%d}`, exp)) + ".", auth.Principal{}, auth.ErrInvalid},
		{"alg none, signed by the library", sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, jwt.MapClaims{"sub": "alice", "exp": exp}), auth.Principal{}, auth.ErrInvalid},
		{"RS256", sign(t, jwt.SigningMethodRS256, rsaKey, jwt.MapClaims{"sub": "alice", "exp": exp}), auth.Principal{}, auth.ErrInvalid},
		{"HS384 with the secret", sign(t, jwt.SigningMethodHS384, secret, jwt.MapClaims{"sub": "alice", "exp": exp}), auth.Principal{}, auth.ErrInvalid},
		{"no subject", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"device": "d", "exp": exp}), auth.Principal{}, auth.ErrInvalid},
		{"subject with a space", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a b", "exp": exp}), auth.Principal{}, auth.ErrInvalid},
		{"subject of 65 bytes", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": strings.Repeat("a", 65), "exp": exp}), auth.Principal{}, auth.ErrInvalid},
		{"subject not a string", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": 42, "exp": exp}), auth.Principal{}, auth.ErrInvalid},
		{"bad device", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a", "device": "x,y", "exp": exp}), auth.Principal{}, auth.ErrInvalid},
		{"two parts", "a.b", auth.Principal{}, auth.ErrInvalid},
		{"four parts", good + ".x", auth.Principal{}, auth.ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := a.Credential(tc.cred)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err: got %v, want %v", err, tc.wantErr)
			}
			if !samePrincipal(got, tc.want) {
				t.Errorf("principal: got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func samePrincipal(a, b auth.Principal) bool {
	return a.Kind == b.Kind && a.UserID == b.UserID && a.Device == b.Device && a.Expires.Equal(b.Expires)
}

// signHeader signs claims with HS256 and the test secret, with extra
// header fields.
func signHeader(t *testing.T, header map[string]any, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodHS256, c)
	for k, v := range header {
		tok.Header[k] = v
	}
	s, err := tok.SignedString(secret)
	if err != nil {
		t.Fatalf("signing: %v", err)
	}
	return s
}

// TestTokenRules: the rules beyond signature and expiry — the maximum
// lifetime (from now and from iat), aud, iss and crit — each refuse what
// they must and nothing else.
func TestTokenRules(t *testing.T) {
	now := t0.Unix()
	h := int64(time.Hour / time.Second)
	day := 24 * h
	claims := func(kv ...any) jwt.MapClaims {
		c := jwt.MapClaims{"sub": "alice"}
		for i := 0; i < len(kv); i += 2 {
			c[kv[i].(string)] = kv[i+1]
		}
		return c
	}
	hs := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodHS256, secret, c) }
	def := auth.Config{}
	short := auth.Config{MaxLifetime: time.Hour}
	aud := auth.Config{Audience: "presenced"}
	iss := auth.Config{Issuer: "https://app.example"}
	tests := []struct {
		name string
		cfg  auth.Config
		cred string
		ok   bool
	}{
		// The maximum lifetime, counted from now (with the leeway).
		{"exp in 24h", def, hs(claims("exp", now+day)), true},
		{"exp in 24h and 20s: within the leeway", def, hs(claims("exp", now+day+20)), true},
		{"exp in 24h and 31s", def, hs(claims("exp", now+day+31)), false},
		{"exp in 100 years", def, hs(claims("exp", now+100*365*day)), false},
		{"exp in the year 3000", def, hs(claims("exp", time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC).Unix())), false},
		{"exp of 1e300", def, hs(claims("exp", 1e300)), false},
		{"exp in 2h, maximum 1h", short, hs(claims("exp", now+2*h)), false},
		{"exp in 1h, maximum 1h", short, hs(claims("exp", now+h)), true},
		// And from iat, exactly (both ends are the minter's clock).
		{"iat now, exp in 24h", def, hs(claims("iat", now, "exp", now+day)), true},
		{"iat now, exp in 24h and 1s", def, hs(claims("iat", now, "exp", now+day+1)), false},
		{"a 25h token with 2h left", def, hs(claims("iat", now-23*h, "exp", now+2*h)), false},
		{"a 24h token with 2h left", def, hs(claims("iat", now-22*h, "exp", now+2*h)), true},
		{"Sign's 24h token", def, mustSign(t, "alice", "", t0, 24*time.Hour), true},
		{"Sign's 24h token, maximum 1h", short, mustSign(t, "alice", "", t0, 24*time.Hour), false},
		// crit: no extension is understood, so any crit is refused.
		{"crit", def, signHeader(t, map[string]any{"crit": []string{"exp"}}, claims("exp", now+h)), false},
		{"empty crit", def, signHeader(t, map[string]any{"crit": []string{}}, claims("exp", now+h)), false},
		{"null crit", def, signHeader(t, map[string]any{"crit": nil}, claims("exp", now+h)), false},
		{"other header fields", def, signHeader(t, map[string]any{"kid": "k1", "cty": "x"}, claims("exp", now+h)), true},
		// aud, when required: a string or an array holding it.
		{"aud not required", def, hs(claims("exp", now+h, "aud", "other")), true},
		{"aud required, none", aud, hs(claims("exp", now+h)), false},
		{"aud string", aud, hs(claims("exp", now+h, "aud", "presenced")), true},
		{"aud array", aud, hs(claims("exp", now+h, "aud", []string{"other", "presenced"})), true},
		{"aud other", aud, hs(claims("exp", now+h, "aud", "other")), false},
		{"aud array without it", aud, hs(claims("exp", now+h, "aud", []string{"other", "Presenced"})), false},
		{"aud empty array", aud, hs(claims("exp", now+h, "aud", []string{})), false},
		{"aud not a string", aud, hs(claims("exp", now+h, "aud", 7)), false},
		// iss, when required: exactly.
		{"iss not required", def, hs(claims("exp", now+h, "iss", "anyone")), true},
		{"iss required, none", iss, hs(claims("exp", now+h)), false},
		{"iss", iss, hs(claims("exp", now+h, "iss", "https://app.example")), true},
		{"iss other", iss, hs(claims("exp", now+h, "iss", "https://app.example/")), false},
		{"Token.Sign with aud and iss", auth.Config{Audience: "presenced", Issuer: "https://app.example"},
			func() string {
				s, err := auth.Token{User: "alice", Audience: "presenced", Issuer: "https://app.example"}.Sign(secret, t0, time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}(), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.JWTSecret, tc.cfg.Clock = secret, clock.NewFake(t0)
			got, err := auth.New(tc.cfg).Credential(tc.cred)
			if tc.ok {
				if err != nil || got.Kind != auth.Client || got.UserID != "alice" {
					t.Fatalf("got %+v, %v; want alice's token accepted", got, err)
				}
				return
			}
			if !errors.Is(err, auth.ErrInvalid) {
				t.Fatalf("got %+v, %v; want ErrInvalid", got, err)
			}
			if got != (auth.Principal{}) {
				t.Errorf("a refused token gave principal %+v", got)
			}
		})
	}
}

// TestTokenRuleMessages: each refusal says which rule it is.
func TestTokenRuleMessages(t *testing.T) {
	a := auth.New(auth.Config{JWTSecret: secret, Clock: clock.NewFake(t0), Audience: "presenced", Issuer: "app"})
	exp := t0.Add(time.Hour).Unix()
	tests := []struct {
		name, cred, want string
	}{
		{"lifetime", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a", "aud": "presenced", "iss": "app", "exp": t0.Add(48 * time.Hour).Unix()}), "maximum token lifetime of 24h0m0s"},
		{"crit", signHeader(t, map[string]any{"crit": []string{"x"}}, jwt.MapClaims{"sub": "a", "aud": "presenced", "iss": "app", "exp": exp}), "crit"},
		{"aud", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a", "iss": "app", "exp": exp}), `audience must include "presenced"`},
		{"iss", sign(t, jwt.SigningMethodHS256, secret, jwt.MapClaims{"sub": "a", "aud": "presenced", "exp": exp}), `issuer must be "app"`},
	}
	for _, tc := range tests {
		_, err := a.Credential(tc.cred)
		if !errors.Is(err, auth.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want ErrInvalid saying %q", tc.name, err, tc.want)
		}
	}
}

func TestCheckSecret(t *testing.T) {
	for _, tc := range []struct {
		secret string
		ok     bool
	}{
		{"", false},
		{"k", false},
		{strings.Repeat("x", auth.MinSecretLen-1), false},
		{strings.Repeat("x", auth.MinSecretLen), true},
		{strings.Repeat("x", 64), true},
	} {
		err := auth.CheckSecret([]byte(tc.secret))
		if (err == nil) != tc.ok {
			t.Errorf("CheckSecret(%d bytes): %v, want ok %v", len(tc.secret), err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "at least 32 bytes") {
			t.Errorf("CheckSecret(%d bytes): %q does not name the minimum", len(tc.secret), err)
		}
	}
}

// The placeholders of the deployment examples are long enough for the
// length rule: a node refuses them, saying why.
func TestCheckSecretRefusesPlaceholders(t *testing.T) {
	for _, p := range []string{
		"replace-me-with-32-or-more-random-bytes",
		"replace-me-with-32-or-more-random-bytes-too",
		"CHANGEME-CHANGEME-CHANGEME-CHANGEME",
		"an-example-api-key-of-32-bytes-or-more",
		"put-your-secret-here-at-least-32-bytes",
	} {
		err := auth.CheckSecret([]byte(p))
		if err == nil || !strings.Contains(err.Error(), "placeholder") {
			t.Errorf("CheckSecret(%q) = %v, want a placeholder refused", p, err)
		}
	}
	if err := auth.CheckSecret([]byte("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")); err != nil {
		t.Errorf("a generated secret refused: %v", err)
	}
}

func TestTokenExpiresWithTheClock(t *testing.T) {
	clk := clock.NewFake(t0)
	a := auth.New(auth.Config{JWTSecret: secret, Clock: clk, Leeway: time.Second})
	tok := mustSign(t, "alice", "", t0, time.Minute)
	if _, err := a.Credential(tok); err != nil {
		t.Fatalf("fresh: %v", err)
	}
	clk.Advance(time.Minute)
	if _, err := a.Credential(tok); err != nil {
		t.Fatalf("at expiry, within leeway: %v", err)
	}
	clk.Advance(2 * time.Second)
	if _, err := a.Credential(tok); !errors.Is(err, auth.ErrInvalid) {
		t.Fatalf("past expiry: got %v, want ErrInvalid", err)
	}
}

func TestConfigurationLimits(t *testing.T) {
	tok := mustSign(t, "alice", "", t0, time.Hour)
	tests := []struct {
		name    string
		cfg     auth.Config
		cred    string
		want    auth.Kind
		wantErr error
	}{
		{"no secret: tokens refused", auth.Config{APIKey: "key"}, tok, 0, auth.ErrInvalid},
		{"no key: nothing is the key", auth.Config{JWTSecret: secret}, "key", 0, auth.ErrInvalid},
		{"no key: empty is still missing", auth.Config{JWTSecret: secret}, "", 0, auth.ErrMissing},
		{"dev: empty is anonymous", auth.Config{Dev: true}, "", auth.Anonymous, nil},
		{"dev: a bad key is still refused", auth.Config{APIKey: "key", Dev: true}, "nope", 0, auth.ErrInvalid},
		{"dev: the key still counts", auth.Config{APIKey: "key", Dev: true}, "key", auth.Backend, nil},
		{"dev: tokens still count", auth.Config{JWTSecret: secret, Dev: true}, tok, auth.Client, nil},
		{"a key shaped like a token is the key", auth.Config{APIKey: "a.b.c", JWTSecret: secret}, "a.b.c", auth.Backend, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Clock = clock.NewFake(t0)
			a := auth.New(tc.cfg)
			if a.Dev() != tc.cfg.Dev {
				t.Errorf("Dev(): got %v", a.Dev())
			}
			got, err := a.Credential(tc.cred)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err: got %v, want %v", err, tc.wantErr)
			}
			if got.Kind != tc.want {
				t.Errorf("kind: got %v, want %v", got.Kind, tc.want)
			}
		})
	}
}

func TestRequestHeader(t *testing.T) {
	a := auth.New(auth.Config{APIKey: "key", JWTSecret: secret, Clock: clock.NewFake(t0)})
	tok := mustSign(t, "alice", "", t0, time.Hour)
	tests := []struct {
		name, header string
		want         auth.Kind
		wantErr      error
	}{
		{"none", "", 0, auth.ErrMissing},
		{"bearer key", "Bearer key", auth.Backend, nil},
		{"bearer token", "Bearer " + tok, auth.Client, nil},
		{"lower-case scheme", "bearer key", auth.Backend, nil},
		{"upper-case scheme", "BEARER " + tok, auth.Client, nil},
		{"extra spaces", "Bearer   key  ", auth.Backend, nil},
		{"empty bearer", "Bearer ", 0, auth.ErrMissing},
		{"no scheme", "key", 0, auth.ErrInvalid},
		{"basic", "Basic a2V5Og==", 0, auth.ErrInvalid},
		{"scheme glued", "Bearerkey", 0, auth.ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			if tc.header != "" {
				r.Header.Set("Authorization", tc.header)
			}
			got, err := a.Request(r)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err: got %v, want %v", err, tc.wantErr)
			}
			if got.Kind != tc.want {
				t.Errorf("kind: got %v, want %v", got.Kind, tc.want)
			}
		})
	}
}

func TestSignClaims(t *testing.T) {
	tok := mustSign(t, "alice", "phone", t0, time.Hour)
	var c jwt.MapClaims
	p := jwt.NewParser(jwt.WithTimeFunc(func() time.Time { return t0 }))
	parsed, err := p.ParseWithClaims(tok, &c, func(*jwt.Token) (any, error) { return secret, nil })
	if err != nil {
		t.Fatal(err)
	}
	if alg := parsed.Header["alg"]; alg != "HS256" {
		t.Errorf("alg: got %v, want HS256", alg)
	}
	want := map[string]any{"sub": "alice", "device": "phone", "iat": float64(t0.Unix()), "exp": float64(t0.Add(time.Hour).Unix())}
	for k, v := range want {
		if c[k] != v {
			t.Errorf("claim %s: got %v, want %v", k, c[k], v)
		}
	}
	c = jwt.MapClaims{}
	if _, err := p.ParseWithClaims(mustSign(t, "bob", "", t0, time.Minute), &c, func(*jwt.Token) (any, error) { return secret, nil }); err != nil {
		t.Fatal(err)
	}
	if c["exp"] != float64(t0.Add(time.Minute).Unix()) {
		t.Errorf("ttl 1m: exp: got %v, want %d", c["exp"], t0.Add(time.Minute).Unix())
	}
	if _, ok := c["device"]; ok {
		t.Errorf("no device: device claim present: %v", c)
	}
}

// TestSignRefusesNoExpiry: every token Sign makes expires; a lifetime of
// zero or less (which once meant "never") is an error, not a token.
func TestSignRefusesNoExpiry(t *testing.T) {
	for _, ttl := range []time.Duration{0, -time.Nanosecond, -time.Hour} {
		tok, err := auth.Sign(secret, "alice", "", t0, ttl)
		if err == nil || tok != "" {
			t.Errorf("Sign(ttl %v): got %q, %v; want no token and an error", ttl, tok, err)
		}
	}
}

// TestPrincipalDecisions: what each kind of caller may act, read, manage
// and connect as — the decisions the HTTP API and the gateway share.
func TestPrincipalDecisions(t *testing.T) {
	backend := auth.Principal{Kind: auth.Backend}
	client := auth.Principal{Kind: auth.Client, UserID: "alice"}
	bound := auth.Principal{Kind: auth.Client, UserID: "alice", Device: "phone"}
	anon := auth.Principal{Kind: auth.Anonymous}
	denied := func(err error) bool {
		var d *auth.Denied
		return errors.As(err, &d)
	}
	for _, tc := range []struct {
		name string
		got  string
		want string
	}{
		{"backend acts for the named user", must(backend.ActFor("bob")), "bob"},
		{"client acts for itself", must(client.ActFor("")), "alice"},
		{"client names itself", must(client.ActFor("alice")), "alice"},
		{"anonymous acts for the named user", must(anon.ActFor("bob")), "bob"},
		{"client reads as itself", must(client.ReadAs("")), "alice"},
		{"backend reads anonymously", must(backend.ReadAs("")), ""},
		{"backend reads as a viewer", must(backend.ReadAs("bob")), "bob"},
		{"bound token's device", must(bound.DeviceFor("")), "phone"},
		{"unbound token names a device", must(client.DeviceFor("tablet")), "tablet"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, tc.got, tc.want)
		}
	}
	for _, tc := range []struct {
		name string
		err  error
		ok   func(error) bool
	}{
		{"client acts for another", second(client.ActFor("bob")), denied},
		{"client reads as another", second(client.ReadAs("bob")), denied},
		{"client manages another", client.Manages("bob"), denied},
		{"bound token names another device", second(bound.DeviceFor("tablet")), denied},
		{"backend names no user", second(backend.ActFor("")), func(err error) bool { return errors.Is(err, auth.ErrNoUser) }},
		{"anonymous names no user", second(anon.ActFor("")), func(err error) bool { return errors.Is(err, auth.ErrNoUser) }},
	} {
		if !tc.ok(tc.err) {
			t.Errorf("%s: %v", tc.name, tc.err)
		}
	}
	if err := client.Manages("alice"); err != nil {
		t.Errorf("client manages itself: %v", err)
	}
	if err := backend.Manages("bob"); err != nil {
		t.Errorf("backend manages anyone: %v", err)
	}
}

func must(s string, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return s
}

func second(_ string, err error) error { return err }

// rawToken signs the JSON texts header and claims as they are, with HS256
// and key: what a minter of another library, or a forger holding the
// secret of a careless deployment, could send.
func rawToken(key []byte, header, claims string) string {
	b64 := base64.RawURLEncoding.EncodeToString
	in := b64([]byte(header)) + "." + b64([]byte(claims))
	m := hmac.New(sha256.New, key)
	m.Write([]byte(in))
	return in + "." + b64(m.Sum(nil))
}

// TestClaimsDecodedStrictly: the header and claims of a token are read by
// the rule of every JSON object the node takes (package strictjson). The
// JSON decoder alone matched names without regard to case and kept the
// last of two: {"sub":"alice","SUB":"admin"} acted as admin, "Exp" counted
// as exp, a string of digits passed as a time, and an iat 10⁹ s ahead
// was taken (and let the lifetime counted from it pass).
func TestClaimsDecodedStrictly(t *testing.T) {
	a := auth.New(auth.Config{JWTSecret: secret, Clock: clock.NewFake(t0)})
	now, exp := t0.Unix(), t0.Add(time.Hour).Unix()
	hs := `{"alg":"HS256","typ":"JWT"}`
	for _, tc := range []struct {
		name, header, claims string
		want                 string // a word of the refusal; "" accepted as alice
	}{
		{"plain", hs, fmt.Sprintf(`{"sub":"alice","exp":%d}`, exp), ""},
		{"the app's own claims", hs, fmt.Sprintf(`{"sub":"alice","exp":%d,"name":"Alice","roles":["a"],"org":{"sub":"x","SUB":1},"scope":null}`, exp), ""},
		{"iat within the skew", hs, fmt.Sprintf(`{"sub":"alice","exp":%d,"iat":%d}`, exp, now+30), ""},
		{"fractional times", hs, fmt.Sprintf(`{"sub":"alice","exp":%d.5,"iat":%d.25}`, exp, now), ""},
		{"kid and cty", `{"alg":"HS256","kid":"k1","cty":"x"}`, fmt.Sprintf(`{"sub":"alice","exp":%d}`, exp), ""},
		{"SUB beside sub", hs, fmt.Sprintf(`{"sub":"alice","SUB":"admin","exp":%d}`, exp), `"SUB", which is not "sub"`},
		{"SUB alone", hs, fmt.Sprintf(`{"SUB":"admin","exp":%d}`, exp), `"SUB"`},
		{"sub twice", hs, fmt.Sprintf(`{"sub":"u1","sub":"u2","exp":%d}`, exp), `"sub" twice`},
		{"sub twice, escaped", hs, fmt.Sprintf(`{"sub":"alice","s\u0075b":"admin","exp":%d}`, exp), `"sub" twice`},
		{"Exp for exp", hs, fmt.Sprintf(`{"sub":"alice","Exp":%d}`, exp), `"Exp"`},
		{"exp twice", hs, fmt.Sprintf(`{"sub":"alice","exp":%d,"exp":%d}`, now-7200, exp), `"exp" twice`},
		{"exp a string of digits", hs, fmt.Sprintf(`{"sub":"alice","exp":"%d"}`, exp), `"exp" a string: it takes a number`},
		{"iat a string of digits", hs, fmt.Sprintf(`{"sub":"alice","exp":%d,"iat":"%d"}`, exp, now), `"iat" a string`},
		{"device twice", hs, fmt.Sprintf(`{"sub":"alice","device":"a","device":"b","exp":%d}`, exp), `"device" twice`},
		{"iat 10⁹ s ahead", hs, fmt.Sprintf(`{"sub":"alice","exp":%d,"iat":%d}`, exp, now+1e9), "iat is"},
		{"iat 31 s ahead", hs, fmt.Sprintf(`{"sub":"alice","exp":%d,"iat":%d}`, exp, now+31), "iat is 31s after now"},
		{"exp far out of range", hs, `{"sub":"alice","exp":1e300}`, "out of range"},
		{"claims not an object", hs, `["alice"]`, "not a JSON object"},
		{"claims with invalid UTF-8", hs, fmt.Sprintf("{\"sub\":\"alice\",\"x\":\"\xff\",\"exp\":%d}", exp), "UTF-8"},
		{"alg twice", `{"alg":"none","alg":"HS256"}`, fmt.Sprintf(`{"sub":"alice","exp":%d}`, exp), `"alg" twice`},
		{"ALG beside alg", `{"alg":"HS256","ALG":"none"}`, fmt.Sprintf(`{"sub":"alice","exp":%d}`, exp), `"ALG"`},
		{"Crit", `{"alg":"HS256","Crit":["exp"]}`, fmt.Sprintf(`{"sub":"alice","exp":%d}`, exp), `"Crit"`},
		{"header data after the object", `{"alg":"HS256"} {}`, fmt.Sprintf(`{"sub":"alice","exp":%d}`, exp), "after the JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := a.Credential(rawToken(secret, tc.header, tc.claims))
			if tc.want == "" {
				if err != nil || p.Kind != auth.Client || p.UserID != "alice" {
					t.Fatalf("got %+v, %v; want alice", p, err)
				}
				return
			}
			if !errors.Is(err, auth.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %+v, %v; want ErrInvalid saying %q", p, err, tc.want)
			}
			if p != (auth.Principal{}) {
				t.Errorf("a refused token gave principal %+v", p)
			}
		})
	}
}

func signRooms(t *testing.T, rooms []string) string {
	t.Helper()
	tok, err := auth.Token{User: "alice", Rooms: rooms}.Sign(secret, t0, time.Hour)
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	return tok
}

// TestRoomsClaim: a client token's rooms claim lets its user into the
// rooms it names exactly, those a prefix pattern covers, or all with
// "*"; a token without the claim into none, and is otherwise as before.
func TestRoomsClaim(t *testing.T) {
	a := auth.New(auth.Config{APIKey: "key", JWTSecret: secret, Clock: clock.NewFake(t0)})
	for _, tc := range []struct {
		name    string
		rooms   []string
		allowed []string
		refused []string
	}{
		{"no claim", nil, nil, []string{"doc-42", "*", "a"}},
		{"empty claim", []string{}, nil, []string{"doc-42", "*"}},
		{"one room", []string{"doc-42"}, []string{"doc-42"}, []string{"doc-4", "doc-420", "Doc-42", "doc-", "doc-*", "*"}},
		{"a prefix", []string{"doc-*"}, []string{"doc-", "doc-42", "doc-*", "doc--", "doc-名前"}, []string{"do", "doc", "Doc-42", "xdoc-42", "*"}},
		{"every room", []string{"*"}, []string{"doc-42", "a", "*", "名前", strings.Repeat("z", 64)}, nil},
		{"ids and prefixes", []string{"lobby", "team-7-*", "t*"},
			[]string{"lobby", "team-7-", "team-7-a", "t", "team-8", "tx"}, []string{"lobby2", "lobb", "Team-7-a", "u"}},
		{"a prefix of 64 bytes", []string{strings.Repeat("p", 64) + "*"}, []string{strings.Repeat("p", 64)}, []string{strings.Repeat("p", 63)}},
		{"a prefix of one byte", []string{"a*"}, []string{"a", "ab", "a*"}, []string{"b", "A"}},
		{"the same twice", []string{"doc-42", "doc-42", "doc-*", "doc-*"}, []string{"doc-42", "doc-1"}, []string{"do"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tok string
			if tc.rooms == nil {
				tok = mustSign(t, "alice", "phone", t0, time.Hour)
			} else {
				tok = signRooms(t, tc.rooms)
			}
			p, err := a.Credential(tok)
			if err != nil || p.Kind != auth.Client || p.UserID != "alice" {
				t.Fatalf("got %+v, %v; want alice's token accepted", p, err)
			}
			if (p.Rooms == nil) != (len(tc.rooms) == 0) {
				t.Errorf("Rooms %v for claim %q", p.Rooms, tc.rooms)
			}
			for _, r := range tc.allowed {
				if !p.AllowsRoom(r) {
					t.Errorf("claim %q: room %q refused", tc.rooms, r)
				}
			}
			for _, r := range tc.refused {
				if p.AllowsRoom(r) {
					t.Errorf("claim %q: room %q allowed", tc.rooms, r)
				}
			}
		})
	}
}

// TestAllowsRoomByKind: the API key and development mode's anonymous
// caller may enter every room; a client without a claim none.
func TestAllowsRoomByKind(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    auth.Principal
		want bool
	}{
		{"backend", auth.Principal{Kind: auth.Backend}, true},
		{"anonymous", auth.Principal{Kind: auth.Anonymous}, true},
		{"client without claim", auth.Principal{Kind: auth.Client, UserID: "alice"}, false},
		{"an unknown kind", auth.Principal{Kind: 9}, false},
	} {
		for _, room := range []string{"doc-42", "*", "x"} {
			if got := tc.p.AllowsRoom(room); got != tc.want {
				t.Errorf("%s: AllowsRoom(%q) = %v, want %v", tc.name, room, got, tc.want)
			}
		}
	}
	rooms, err := auth.ParseRooms([]string{"doc-*"})
	if err != nil {
		t.Fatal(err)
	}
	client := auth.Principal{Kind: auth.Client, UserID: "alice", Rooms: rooms}
	if !client.AllowsRoom("doc-1") || client.AllowsRoom("dob-1") {
		t.Errorf("client with doc-*: doc-1 %v, dob-1 %v", client.AllowsRoom("doc-1"), client.AllowsRoom("dob-1"))
	}
	var none *auth.Rooms
	if none.Allows("doc-1") {
		t.Error("nil Rooms allows a room")
	}
}

// TestParseRooms: each entry is a room id, a non-empty prefix and one
// trailing "*", or "*" alone, with ids' rules; each refusal says which
// entry and why.
func TestParseRooms(t *testing.T) {
	many := make([]string, auth.MaxRoomPatterns+1)
	for i := range many {
		many[i] = fmt.Sprintf("room-%d", i)
	}
	for _, tc := range []struct {
		name  string
		claim []string
		want  string // a word of the refusal; "" accepted
	}{
		{"id", []string{"doc-42"}, ""},
		{"prefix", []string{"doc-*"}, ""},
		{"star", []string{"*"}, ""},
		{"star among others", []string{"a", "*", "b*"}, ""},
		{"id of 64 bytes", []string{strings.Repeat("a", 64)}, ""},
		{"prefix of 64 bytes and the star", []string{strings.Repeat("a", 64) + "*"}, ""},
		{"NFC", []string{"caf\u00e9", "caf\u00e9-*"}, ""},
		{"100 entries", many[:100], ""},
		{"101 entries", many, "the claim holds 101 entries, the limit is 100"},
		{"empty", []string{"a", ""}, `entry 1 "" is empty`},
		{"star first", []string{"*doc"}, `entry 0 "*doc" has a "*" at byte 0`},
		{"star inside", []string{"a*b"}, `entry 0 "a*b" has a "*" at byte 1`},
		{"two stars", []string{"**"}, `entry 0 "**" has a "*" at byte 0`},
		{"two trailing stars", []string{"doc-**"}, `entry 0 "doc-**" has a "*" at byte 4`},
		{"id of 65 bytes", []string{strings.Repeat("a", 65)}, "is no room id: id is 65 bytes long, the limit is 64"},
		{"prefix of 65 bytes", []string{strings.Repeat("a", 65) + "*"}, "is no prefix of room ids: id is 65 bytes long"},
		{"long entry quoted short", []string{strings.Repeat("a", 1000)}, `"` + strings.Repeat("a", 64) + `"… (1000 bytes)`},
		{"space", []string{"doc 42"}, "is no room id: id contains a forbidden character"},
		{"comma in a prefix", []string{"a,b*"}, "is no prefix of room ids: id contains a forbidden character ','"},
		{"not NFC", []string{"cafe\u0301"}, "not in Unicode normalization form NFC"},
		{"prefix not NFC", []string{"cafe\u0301*"}, "is no prefix of room ids: id is not in Unicode normalization form NFC"},
		{"invalid UTF-8", []string{"doc-\xff"}, "not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := auth.ParseRooms(tc.claim)
			if tc.want == "" {
				if err != nil || r == nil {
					t.Fatalf("ParseRooms(%q) = %v, %v; want accepted", tc.claim, r, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || r != nil {
				t.Fatalf("ParseRooms = %v, %v; want refused saying %q", r, err, tc.want)
			}
			// Sign refuses what the server would.
			if tok, err := (auth.Token{User: "alice", Rooms: tc.claim}).Sign(secret, t0, time.Hour); err == nil || tok != "" {
				t.Errorf("Sign: got %q, %v; want no token and an error", tok, err)
			}
		})
	}
	for _, empty := range [][]string{nil, {}} {
		if r, err := auth.ParseRooms(empty); r != nil || err != nil {
			t.Errorf("ParseRooms(%#v) = %v, %v; want nil, nil", empty, r, err)
		}
	}
}

// TestRoomsClaimDecodedStrictly: a bad rooms claim makes the whole token
// invalid, with the reason; it is decoded by the rule of every claim.
func TestRoomsClaimDecodedStrictly(t *testing.T) {
	a := auth.New(auth.Config{JWTSecret: secret, Clock: clock.NewFake(t0)})
	exp := t0.Add(time.Hour).Unix()
	hs := `{"alg":"HS256","typ":"JWT"}`
	many := strings.TrimSuffix(strings.Repeat(`"r",`, auth.MaxRoomPatterns+1), ",")
	for _, tc := range []struct {
		name, rooms string // the claim's JSON; "" none
		want        string // a word of the refusal; "" accepted
		room        string // a room the accepted token allows
	}{
		{"none", "", "", ""},
		{"null", `null`, "", ""},
		{"an empty list", `[]`, "", ""},
		{"ids and a prefix", `["doc-42","team-7-*"]`, "", "team-7-x"},
		{"every room", `["*"]`, "", "anything"},
		{"a string", `"doc-42"`, `"rooms"`, ""},
		{"an object", `{"doc-42":true}`, `"rooms"`, ""},
		{"a number inside", `["doc-42",7]`, `"rooms"`, ""},
		{"a null inside", `["doc-42",null]`, `token rooms: entry 1 "" is empty`, ""},
		{"a bad pattern", `["doc-42","a*b"]`, `token rooms: entry 1 "a*b" has a "*"`, ""},
		{"too many", "[" + many + "]", "token rooms: the claim holds 101 entries, the limit is 100", ""},
		{"Rooms for rooms", `["*"],"Rooms":["*"]`, `"Rooms"`, ""},
		{"rooms twice", `["doc-1"],"rooms":["*"]`, `"rooms" twice`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claims := fmt.Sprintf(`{"sub":"alice","exp":%d}`, exp)
			if tc.rooms != "" {
				claims = fmt.Sprintf(`{"sub":"alice","exp":%d,"rooms":%s}`, exp, tc.rooms)
			}
			p, err := a.Credential(rawToken(secret, hs, claims))
			if tc.want == "" {
				if err != nil || p.Kind != auth.Client || p.UserID != "alice" {
					t.Fatalf("got %+v, %v; want alice", p, err)
				}
				if tc.room == "" && (p.Rooms != nil || p.AllowsRoom("doc-42")) {
					t.Errorf("claim %s: rooms %v, want none", tc.rooms, p.Rooms)
				}
				if tc.room != "" && !p.AllowsRoom(tc.room) {
					t.Errorf("claim %s: room %q refused", tc.rooms, tc.room)
				}
				return
			}
			if !errors.Is(err, auth.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %+v, %v; want ErrInvalid saying %q", p, err, tc.want)
			}
			if p != (auth.Principal{}) {
				t.Errorf("a refused token gave principal %+v", p)
			}
		})
	}
}

// TestSignRooms: Token.Sign writes the rooms claim as given, and none
// without rooms.
func TestSignRooms(t *testing.T) {
	p := jwt.NewParser(jwt.WithTimeFunc(func() time.Time { return t0 }))
	for _, tc := range []struct {
		rooms []string
		want  any
	}{
		{[]string{"doc-42", "team-7-*", "*"}, []any{"doc-42", "team-7-*", "*"}},
		{nil, nil},
		{[]string{}, nil},
	} {
		var c jwt.MapClaims
		if _, err := p.ParseWithClaims(signRooms(t, tc.rooms), &c, func(*jwt.Token) (any, error) { return secret, nil }); err != nil {
			t.Fatal(err)
		}
		got, ok := c["rooms"]
		if tc.want == nil && ok {
			t.Errorf("rooms %#v: claim %v present", tc.rooms, got)
		}
		if tc.want != nil && fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("rooms %#v: claim %v, want %v", tc.rooms, got, tc.want)
		}
	}
}

// Package httpapi is presenced's HTTP edge: the seed batch endpoint, the
// /v1 API for clients and app backends, health, readiness and metrics. It
// authenticates every call, validates every input before anything changes,
// and lets presence out only through the privacy filter (via the query
// reader).
package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/origin"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/privacy"
	"github.com/presenced/presenced/internal/ratelimit"
	"github.com/presenced/presenced/internal/tracing"
	"github.com/presenced/presenced/internal/wire"
)

// Tracker is the write side the API drives.
type Tracker interface {
	Heartbeat(ctx context.Context, user, device string, active bool) (presence.Change, error)
	SetStatus(ctx context.Context, user string, m presence.Manual, text string) (presence.Change, error)
	Bye(ctx context.Context, user, device string) (presence.Change, error)
	SetSettings(ctx context.Context, user string, s presence.Settings) error
	Settings(ctx context.Context, user string) (presence.Settings, error)
	Debug(ctx context.Context, user string) (presence.User, int64, bool, error)
}

// HeartbeatReader is an optional ability of a Tracker: a heartbeat that
// also reads the user back in the same store call (tracker.Tracker on
// Redis), so the answer needs no second round trip. It reports whether
// snap was filled.
type HeartbeatReader interface {
	HeartbeatRead(ctx context.Context, user, device string, active bool, snap *presence.Snapshot) (presence.Change, bool, error)
}

// Reader answers privacy-filtered reads.
type Reader interface {
	Read(ctx context.Context, viewer string, ids []string, out []privacy.View) error
}

// StatusReader is an optional ability of a Reader: a read of which only
// the statuses are used, which a node's read replica may answer
// (query.Reader.ReadStatuses). The seed's batch endpoint uses it.
type StatusReader interface {
	ReadStatuses(ctx context.Context, viewer string, ids []string, out []privacy.View) error
}

// ViewReader is an optional ability of a Reader: a read that may be a
// moment late, which a node's read replica may answer
// (query.Reader.ReadViews). The reads of views over HTTP use it; a
// snapshot that a watch continues never does.
type ViewReader interface {
	ReadViews(ctx context.Context, viewer string, ids []string, out []privacy.View) error
}

// readViews reads views with the Reader's ReadViews if it has one.
func (s *Server) readViews(ctx context.Context, viewer string, ids []string, out []privacy.View) error {
	if vr, ok := s.reader.(ViewReader); ok {
		return vr.ReadViews(ctx, viewer, ids, out)
	}
	return s.reader.Read(ctx, viewer, ids, out)
}

// ContactBook manages contact lists.
type ContactBook interface {
	SetContacts(ctx context.Context, user string, contacts []string) error
	AddContacts(ctx context.Context, user string, contacts []string) error
	RemoveContacts(ctx context.Context, user string, contacts []string) error
	Contacts(ctx context.Context, user string) ([]string, error)
}

// Profiles reads durable profiles (for the debug view of users not in memory).
type Profiles interface {
	LoadProfiles(ctx context.Context, ids []string, fn func(*presence.Profile)) error
}

// Observer records request metrics.
type Observer interface {
	Observe(route string, code int, d time.Duration)
}

// DefaultPollInterval is Config.PollInterval's default.
const DefaultPollInterval = 30 * time.Second

// Config configures a Server. Zero values take the documented defaults.
type Config struct {
	Tracker        Tracker     // required
	Reader         Reader      // required
	Contacts       ContactBook // required
	Profiles       Profiles    // required
	Auth           *auth.Authenticator
	Clock          clock.Clock
	Logger         *slog.Logger
	Rules          presence.Rules
	Metrics        Observer     // nil: no request metrics
	MetricsHandler http.Handler // serves /metrics; nil: 404
	// Checks are what GET /readyz reports on, in this order (see Check);
	// none: ready unless draining.
	Checks []Check
	// PollInterval throttles reads by clients with their own token: one per
	// user per interval. Default DefaultPollInterval; negative disables.
	PollInterval time.Duration
	// MaxBody is the largest request body in bytes. Default 1 MiB (a full
	// contact list); the batch read accepts what 1,000 ids need.
	MaxBody int64
	// Static serves GET / and GET /static/… (the browser side); nil: 404.
	Static http.Handler
	// Admin feeds GET /v1/admin/stats (the operator page); nil: that
	// endpoint answers 404.
	Admin Admin
	// OnContactsChanged is called after a change of owner's contact list is
	// durable (the fan-out re-classifies owner's watchers); nil: nothing.
	OnContactsChanged func(owner string)
	// Writes are the per-user buckets of client writes, shared with the
	// WebSocket gateway so that a user's status changes count once
	// whichever edge they come through; nil: buckets of the server's own.
	Writes *ratelimit.Writes
	// Origins are the browser pages that may call the node (package
	// origin); nil: the node's own pages only. A request whose Origin
	// names another page is refused with 403 origin_not_allowed; the
	// endpoints a page calls with a client token answer the allowed ones
	// with CORS headers (see ServeHTTP). Requests without an Origin
	// header (backends, curl) pass.
	Origins *origin.Policy
}

// Server is the HTTP API. It is an http.Handler, safe for concurrent use.
type Server struct {
	tracker  Tracker
	reader   Reader
	contacts ContactBook
	profiles Profiles
	auth     *auth.Authenticator
	clock    clock.Clock
	log      *slog.Logger
	rules    presence.Rules
	metrics  Observer
	checks   []Check
	checkMu  sync.Mutex // guards checkSt
	checkSt  []string   // per check: its state when last judged (for the log, and a probe that could not judge it)
	maxBody  int64
	// Per user of a client token: reads (one per PollInterval) and the
	// durable writes, and per device its joins and leaves of rooms
	// (ratelimit.Writes, shared with the gateway). Backends and -dev
	// requests are not limited.
	polls    *ratelimit.Keyed
	pages    *ratelimit.Keyed // a client's further pages of rooms (ratelimit.RoomPages)
	writes   *ratelimit.Writes
	mux      *http.ServeMux
	patterns []string // every pattern of mux, in order (Patterns)
	draining atomic.Bool
	origins  *origin.Policy
	// browser holds the patterns of the endpoints a browser page calls
	// (see handleBrowser); written by New only.
	browser map[string]bool

	onContactsChanged func(owner string)
	admin             Admin
}

// New returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Tracker == nil || cfg.Reader == nil || cfg.Contacts == nil || cfg.Profiles == nil || cfg.Auth == nil {
		return nil, errors.New("httpapi: Tracker, Reader, Contacts, Profiles and Auth are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Rules = cfg.Rules.WithDefaults()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 1 << 20
	}
	if cfg.Writes == nil {
		cfg.Writes = ratelimit.NewWrites()
	}
	s := &Server{
		tracker:  cfg.Tracker,
		reader:   cfg.Reader,
		contacts: cfg.Contacts,
		profiles: cfg.Profiles,
		auth:     cfg.Auth,
		clock:    cfg.Clock,
		log:      cfg.Logger,
		rules:    cfg.Rules,
		metrics:  cfg.Metrics,
		checks:   cfg.Checks,
		checkSt:  make([]string, len(cfg.Checks)),
		maxBody:  cfg.MaxBody,

		polls:   ratelimit.NewKeyed(ratelimit.Limit{Every: cfg.PollInterval, Burst: 1}),
		pages:   ratelimit.NewKeyed(ratelimit.RoomPages),
		writes:  cfg.Writes,
		mux:     http.NewServeMux(),
		origins: cfg.Origins,
		browser: make(map[string]bool),

		onContactsChanged: cfg.OnContactsChanged,
		admin:             cfg.Admin,
	}
	for i := range s.checkSt {
		s.checkSt[i] = stateOK
	}
	s.routes(cfg.MetricsHandler)
	if cfg.Static != nil {
		static := jsonErrors(cfg.Static) // a missing file is a JSON 404 too
		s.register("GET /{$}", static)
		s.register("GET /static/", static)
		s.register("GET /admin", static) // the operator page
	}
	return s, nil
}

// Drain makes /readyz answer 503 (draining), so load balancers stop sending
// traffic before shutdown.
func (s *Server) Drain() { s.draining.Store(true) }

func (s *Server) routes(metrics http.Handler) {
	// What a browser page calls with a client token (or with nothing:
	// /v1/public), as presence.js does: CORS for allowed origins.
	s.handleBrowser("GET /presence/batch", "batch_seed", s.batchSeed)
	s.handleBrowser("GET /v1/presence/{user_id}", "presence_get", s.presenceGet)
	s.handleBrowser("POST /v1/presence/batch", "presence_batch", s.presenceBatch)
	s.handleBrowser("GET /v1/public/{user_id}", "public_get", s.publicGet)
	s.handleBrowser("POST /v1/heartbeat", "heartbeat", s.heartbeat)
	s.handleBrowser("POST /v1/status", "status", s.status)
	s.handleBrowser("POST /v1/bye", "bye", s.bye)
	s.handleBrowser("GET /v1/users/{user_id}/settings", "settings_get", s.settingsGet)
	s.handleBrowser("PUT /v1/users/{user_id}/settings", "settings_put", s.settingsPut)
	s.handleBrowser("GET /v1/users/{user_id}/contacts", "contacts_get", s.contactsGet)
	s.handleBrowser("PUT /v1/users/{user_id}/contacts", "contacts_put", s.contactsPut)
	s.handleBrowser("POST /v1/users/{user_id}/contacts", "contacts_add", s.contactsAdd)
	s.handleBrowser("PUT /v1/users/{user_id}/contacts/{contact_id}", "contact_add", s.contactAdd)
	s.handleBrowser("DELETE /v1/users/{user_id}/contacts/{contact_id}", "contact_remove", s.contactRemove)
	s.handleBrowser("POST /v1/rooms/{room}/join", "room_join", s.roomJoin)
	s.handleBrowser("POST /v1/rooms/{room}/leave", "room_leave", s.roomLeave)
	s.handleBrowser("GET /v1/rooms/{room}", "room_get", s.roomGet)
	s.handleBrowser("GET /v1/rooms", "room_counts", s.roomCounts)
	// The API key's alone: never CORS, so no page of another origin can
	// read them (metrics below too).
	s.handle("GET /v1/debug/users/{user_id}", "debug_user", s.debugUser)
	s.handle("GET /v1/admin/stats", "admin_stats", s.adminStats)
	s.register("GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, []byte(`{"status":"ok"}`))
	}))
	s.register("GET /readyz", http.HandlerFunc(s.readyz))
	s.register("GET /v1/openapi.json", http.HandlerFunc(serveOpenAPI))
	if metrics != nil {
		// Even counters can give an invisible user away on a quiet node,
		// so metrics are for holders of the API key (Prometheus sends it
		// as a bearer token).
		s.register("GET /metrics", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p, err := s.principal(r)
			if err == nil {
				err = s.backendOnly(r, p)
			}
			if err != nil {
				writeError(w, err)
				return
			}
			metrics.ServeHTTP(w, r)
		}))
	}
}

// register adds h to the mux at pattern and to the list Patterns returns.
func (s *Server) register(pattern string, h http.Handler) {
	s.mux.Handle(pattern, h)
	s.patterns = append(s.patterns, pattern)
}

// Patterns returns the net/http patterns ("GET /v1/presence/{user_id}")
// of every route the Server serves, in the order they were registered:
// the list the API description (OpenAPI) is checked against.
func (s *Server) Patterns() []string { return slices.Clone(s.patterns) }

// BrowserPatterns returns the patterns of the endpoints a browser page
// calls (handleBrowser), in the order they were registered: those that
// answer allowed origins with CORS headers, and whose paths answer their
// preflights (OPTIONS, in ServeHTTP: no route of the mux).
func (s *Server) BrowserPatterns() []string {
	var out []string
	for _, p := range s.patterns {
		if s.browser[p] {
			out = append(out, p)
		}
	}
	return out
}

// ServeHTTP implements http.Handler. Unknown paths and wrong methods get
// JSON errors like everything else.
//
// A request from a page of a refused origin (Config.Origins) gets 403
// origin_not_allowed, whatever it asks. On the endpoints a browser page
// calls (handleBrowser) an allowed origin other than the node's own gets
// Access-Control-Allow-Origin (its own origin, never "*"), and its
// preflight (OPTIONS with Access-Control-Request-Method) is answered 204
// with the methods of the path, the headers Authorization and
// Content-Type, and a Max-Age; every answer of those endpoints varies by
// Origin. The API-key-only endpoints get no CORS header at all, so a
// browser never lets a page of another origin call them, and the API key
// itself is refused from such a page (principal).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	v, o := s.origins.Check(r)
	if v == origin.Refused {
		writeError(w, origin.Refusal(o))
		return
	}
	if v == origin.Allowed && r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
		if s.preflight(w, r, o) {
			return
		}
	}
	_, pattern := s.mux.Handler(r)
	if s.browser[pattern] {
		h := w.Header()
		h.Add("Vary", "Origin")
		if v == origin.Allowed {
			h.Set("Access-Control-Allow-Origin", o)
			h.Set("Access-Control-Expose-Headers", "Retry-After")
		}
	}
	if pattern == "" || !clean(r.URL.Path) {
		s.mux.ServeHTTP(&jsonFallback{ResponseWriter: w, method: r.Method, path: r.URL.Path}, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// corsMaxAge is how long a browser may keep a preflight's answer, in
// seconds (browsers cap it: Chromium at 2 h, Firefox at 24 h).
const corsMaxAge = "3600"

// preflight answers the CORS preflight of an allowed origin o for a
// browser endpoint: 204 with the methods the path takes. It reports false
// when the path is no browser endpoint (the request then gets the usual
// 405 or 404, without CORS headers, and the browser stops there).
func (s *Server) preflight(w http.ResponseWriter, r *http.Request, o string) bool {
	var methods []string
	probe := *r
	for _, m := range [...]string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodDelete} {
		probe.Method = m
		if _, pattern := s.mux.Handler(&probe); s.browser[pattern] && clean(r.URL.Path) {
			methods = append(methods, m)
		}
	}
	if len(methods) == 0 {
		return false
	}
	h := w.Header()
	h.Add("Vary", "Origin")
	h.Add("Vary", "Access-Control-Request-Method")
	h.Add("Vary", "Access-Control-Request-Headers")
	h.Set("Access-Control-Allow-Origin", o)
	h.Set("Access-Control-Allow-Methods", strings.Join(methods, ", "))
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
	h.Set("Access-Control-Max-Age", corsMaxAge)
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
	return true
}

// handlerFunc is an API handler: it writes a success itself or returns an
// error, which is written as JSON.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

func (s *Server) handle(pattern, route string, h handlerFunc) {
	s.register(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := statusWriter{ResponseWriter: w, code: http.StatusOK}
		ctx, span := tracing.StartHTTP(r, route)
		if span != nil {
			r = r.WithContext(ctx)
			defer func() { endSpan(span, sw.code) }() // after the recover below has written a 500
		}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.log.Error("handler panic", "route", route, "panic", p)
				if !sw.wrote {
					writeError(&sw, &Error{Status: 500, Code: "internal", Message: "internal error"})
				}
			}
			if s.metrics != nil {
				s.metrics.Observe(route, sw.code, time.Since(start))
			}
		}()
		if err := h(&sw, r); err != nil {
			if e := classify(err); e.Status >= 500 {
				s.log.Error("request failed", "route", route, "err", err)
			}
			writeError(&sw, err)
		}
	}))
}

// endSpan ends the span of a request answered code.
func endSpan(span trace.Span, code int) {
	span.SetAttributes(attribute.Int("http.response.status_code", code))
	if code >= 500 {
		span.SetStatus(codes.Error, http.StatusText(code))
	}
	span.End()
}

// handleBrowser is handle for an endpoint a browser page calls: it
// answers allowed origins with CORS headers (ServeHTTP).
func (s *Server) handleBrowser(pattern, route string, h handlerFunc) {
	s.browser[pattern] = true
	s.handle(pattern, route, h)
}

type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// jsonFallback turns the mux's plain-text 404 and 405 into JSON errors.
// Anything else (the mux's redirect to a cleaned path) passes through.
type jsonFallback struct {
	http.ResponseWriter
	method, path string
	done, pass   bool
}

// clean reports whether p is a path the mux serves without redirecting
// (its own cleaning: no //, no . or .. elements, a trailing slash kept).
func clean(p string) bool {
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

// jsonErrors answers the 404s and 405s of h (a file server) as JSON.
func jsonErrors(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&jsonFallback{ResponseWriter: w, method: r.Method, path: r.URL.Path}, r)
	})
}

func (w *jsonFallback) WriteHeader(code int) {
	if w.done {
		return
	}
	w.done = true
	if code >= 300 && code < 400 {
		// The mux's redirect of a path that is not clean (/v1//x): a
		// redirect still, with a JSON body instead of the mux's HTML.
		body := wire.AppendString([]byte(`{"location":`), w.Header().Get("Location"))
		writeJSON(w.ResponseWriter, code, append(body, '}'))
		return
	}
	if code != http.StatusNotFound && code != http.StatusMethodNotAllowed {
		w.pass = true
		w.ResponseWriter.WriteHeader(code)
		return
	}
	e := &Error{Status: code, Code: "not_found", Message: fmt.Sprintf("no such endpoint: %s", w.path)}
	if code == http.StatusMethodNotAllowed {
		e.Code = "method_not_allowed"
		e.Message = fmt.Sprintf("%s is not allowed on %s (allowed: %s)", w.method, w.path, w.Header().Get("Allow"))
	}
	writeError(w.ResponseWriter, e)
}

func (w *jsonFallback) Write(b []byte) (int, error) {
	if !w.done {
		w.WriteHeader(http.StatusOK)
	}
	if w.pass {
		return w.ResponseWriter.Write(b)
	}
	return len(b), nil
}

func writeJSON(w http.ResponseWriter, code int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	if h.Get("Cache-Control") == "" {
		h.Set("Cache-Control", "no-store")
	}
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// readBody reads the request body up to the size limit.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &Error{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
				Message: fmt.Sprintf("request body is larger than %d bytes", mbe.Limit)}
		}
		return nil, badRequest("invalid_body", "reading request body: %v", err)
	}
	return body, nil
}

// Check is one part of the node that GET /readyz reports on.
type Check struct {
	// Name names the part in the report: "gateway", "sqlite", "postgres",
	// "redis", "nats".
	Name string
	// Shared says that every node shares the part (PostgreSQL, Redis,
	// NATS). Its failure is reported but leaves the node ready: it fails
	// on every node at once, and a load balancer that took them all out
	// would also lose what still works (with Redis down, heartbeats are
	// buffered and reads answered; with PostgreSQL down, heartbeats and
	// reads of users in Redis). A part of this node only (its WebSocket
	// gateway, its embedded database) makes the node not ready while it
	// fails: another node may serve.
	Shared bool
	// Check returns nil while the part works; it is given at most 2 s
	// (checkTimeout). Its error goes to the log, never to the caller of
	// /readyz; the part's state in the body is "unavailable", or the
	// State of a *StateError in the error's chain.
	Check func(ctx context.Context) error
}

// readyz answers whether this node can serve: 503 while it drains (on
// shutdown) or a part of its own fails, else 200. The body names every
// check and its state, "ok", "unavailable" or a StateError's (runChecks):
//
//	{"status":"ready","checks":{"gateway":"ok","postgres":"unavailable","redis":"ok","nats":"stream_missing"}}
//	{"status":"not_ready","reason":"sqlite","checks":{"gateway":"ok","sqlite":"unavailable"}}
//	{"status":"not_ready","reason":"draining"}
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, []byte(`{"status":"not_ready","reason":"draining"}`))
		return
	}
	reason, results := s.runChecks(r.Context())
	code := http.StatusOK
	b := make([]byte, 0, 128)
	if reason == "" {
		b = append(b, `{"status":"ready"`...)
	} else {
		code = http.StatusServiceUnavailable
		b = append(b, `{"status":"not_ready","reason":`...)
		b = wire.AppendString(b, reason)
	}
	b = append(b, `,"checks":{`...)
	for i, c := range results {
		if i > 0 {
			b = append(b, ',')
		}
		b = wire.AppendString(b, c.name)
		b = append(b, ':')
		b = wire.AppendString(b, c.state)
	}
	b = append(b, "}}"...)
	writeJSON(w, code, append(b, '\n'))
}

// --- who is calling ---

// principal authenticates r. The API key is refused from a browser page
// of another origin, even an allowed one: it belongs on a backend, and a
// page holding it could act for every user.
func (s *Server) principal(r *http.Request) (auth.Principal, error) {
	p, err := s.auth.Request(r) // its errors are 401s (apierr)
	if err == nil && p.Kind == auth.Backend {
		if v, _ := s.origins.Check(r); v != origin.None && v != origin.Same {
			return auth.Principal{}, forbidden("the API key is not accepted from a browser page of another origin: keep it on your backend, and give pages client tokens")
		}
	}
	return p, err
}

// actor resolves the user a write acts for: backends name any user,
// clients act only for the user of their token, and in development mode a
// bare user id is trusted (loudly).
func (s *Server) actor(r *http.Request, p auth.Principal, claimed string) (string, error) {
	user, err := p.ActFor(claimed)
	if err == nil && p.Kind == auth.Anonymous {
		s.warnDev(r, user)
	}
	return user, err
}

// viewer resolves who is looking for a read and applies the client poll
// throttle. An empty result is the anonymous everyone-view.
func (s *Server) viewer(w http.ResponseWriter, r *http.Request, p auth.Principal, claimed string) (string, error) {
	viewer, err := p.ReadAs(claimed)
	if err != nil {
		return "", err
	}
	switch p.Kind {
	case auth.Backend:
		return viewer, nil
	case auth.Client:
		if ok, wait := s.polls.Take(p.UserID, s.clock.Now().UnixMilli()); !ok {
			return "", tooMany(w, wait, fmt.Sprintf("clients may read presence over HTTP once per %s", s.polls.Limit().Every))
		}
		return viewer, nil
	}
	s.warnDev(r, viewer)
	return viewer, nil
}

// limit takes a token for a durable write of p from lim, the buckets of
// one kind of write (what names it in the message): a client token's user
// beyond its limit gets 429 with Retry-After. Backends (the API key) and
// -dev requests are not limited.
func (s *Server) limit(w http.ResponseWriter, p auth.Principal, lim *ratelimit.Keyed, what string) error {
	if p.Kind != auth.Client {
		return nil
	}
	if ok, wait := lim.Take(p.UserID, s.clock.Now().UnixMilli()); !ok {
		return tooMany(w, wait, fmt.Sprintf("too many %s for this user: %s", what, lim.Limit()))
	}
	return nil
}

// tooMany is the 429 of a client beyond a limit (why: the limit), with
// Retry-After set to waitMS in whole seconds, rounded up.
func tooMany(w http.ResponseWriter, waitMS int64, why string) *Error {
	secs := ratelimit.RetryAfter(waitMS)
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	return &Error{Status: http.StatusTooManyRequests, Code: "rate_limited",
		Message: fmt.Sprintf("%s; retry in %ds", why, secs)}
}

// self checks that p may manage the account of user (settings, contacts).
func (s *Server) self(r *http.Request, p auth.Principal, user string) error {
	if p.Kind == auth.Anonymous {
		s.warnDev(r, user)
	}
	return p.Manages(user)
}

func (s *Server) backendOnly(r *http.Request, p auth.Principal) error {
	if p.Kind == auth.Backend {
		return nil
	}
	if p.Kind == auth.Anonymous {
		s.warnDev(r, "")
		return nil
	}
	return forbidden("this endpoint needs the API key")
}

func (s *Server) warnDev(r *http.Request, user string) {
	s.log.Warn("INSECURE development mode: accepted a request without credentials",
		"method", r.Method, "path", r.URL.Path, "user_id", user)
}

// device resolves the device of a client request.
func device(p auth.Principal, claimed string) (string, error) {
	dev, err := p.DeviceFor(claimed)
	if err == nil && dev == "" {
		return "", badRequest("invalid_id", "device_id is required")
	}
	return dev, err
}

// Package backend is the Go client of presenced's HTTP API for app
// backends: the holders of the API key, who read presence as any viewer
// and manage any user's settings and contacts. Its methods and types are
// checked against the API description the node serves at
// GET /v1/openapi.json (internal/httpapi/openapi.json): every request it
// sends and every answer it decodes is validated against it in its tests,
// against a real node.
//
//	b, err := backend.New(backend.Config{URL: "http://127.0.0.1:8080", APIKey: key})
//	views, err := b.Batch(ctx, []string{"7", "9"}, "42") // as user 42 sees them
//	var e *backend.Error
//	if errors.As(err, &e) && e.RetryAfter > 0 { … } // 429, 503: retry later
//
// Every method takes a context first and returns its error as a value: a
// refusal of the node is an *Error with its HTTP status, its stable code
// (docs: the API description) and the Retry-After it asked for; anything
// else (the network, a context ended) is the transport's error, wrapped.
// A Client is safe for concurrent use.
package backend

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Config configures a Client. Zero values take the documented defaults.
type Config struct {
	// URL is the node's base URL: http(s)://host[:port][/prefix].
	// Required.
	URL string
	// APIKey is the node's -api-key, sent as "Authorization: Bearer
	// <key>". Empty: no Authorization header (a -dev node only).
	APIKey string
	// HTTPClient sends the requests; nil: http.DefaultClient. Bound each
	// call with its context (or set a Timeout here).
	HTTPClient *http.Client
}

// Client calls one node (or a load balancer in front of many). It is safe
// for concurrent use.
type Client struct {
	base   string // without a trailing slash
	authz  string // the whole Authorization header, "" for none
	client *http.Client
}

// New returns a Client.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("backend: URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("backend: URL %q: want http(s)://host[:port][/prefix]", cfg.URL)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("backend: URL %q: a base URL has no query or fragment", cfg.URL)
	}
	c := &Client{base: strings.TrimSuffix(u.String(), "/"), client: cfg.HTTPClient}
	if cfg.APIKey != "" {
		c.authz = "Bearer " + cfg.APIKey
	}
	if c.client == nil {
		c.client = http.DefaultClient
	}
	return c, nil
}

// Status is what a user shows.
type Status string

// Statuses. A user sees their own Invisible; everyone else sees Offline.
const (
	Online    Status = "online"
	Away      Status = "away"
	Busy      Status = "busy"
	Offline   Status = "offline"
	Invisible Status = "invisible"
)

// Visibility says who may see a part of a user's presence.
type Visibility string

// Visibilities.
const (
	Everyone Visibility = "everyone"
	Contacts Visibility = "contacts" // the users in the user's contact list
	Nobody   Visibility = "nobody"
)

// View is what a viewer may see of one user. A nil field is hidden from
// the viewer (or, for LastSeen, the user was never seen; for Version, the
// user has none yet).
type View struct {
	UserID     string     `json:"user_id"`
	Status     *Status    `json:"status"`
	LastSeen   *time.Time `json:"last_seen"`
	StatusText *string    `json:"status_text"`
	Devices    *int       `json:"devices"` // alive devices
	Version    *uint64    `json:"version"` // orders the views of one user
}

// SelfView is a user's own view after a write, with the timing a device
// keeps: beat every HeartbeatInterval, alive for TTL after its last beat.
type SelfView struct {
	View
	// DeviceID is the device a heartbeat or bye was for; empty after
	// SetStatus.
	DeviceID            string `json:"device_id,omitempty"`
	TTLMillis           int64  `json:"ttl_ms"`
	HeartbeatIntervalMs int64  `json:"heartbeat_interval_ms"`
}

// TTL is how long a device is alive after its last beat.
func (v *SelfView) TTL() time.Duration { return time.Duration(v.TTLMillis) * time.Millisecond }

// HeartbeatInterval is how often a device should beat.
func (v *SelfView) HeartbeatInterval() time.Duration {
	return time.Duration(v.HeartbeatIntervalMs) * time.Millisecond
}

// Settings are a user's privacy settings: who may see the status (its
// text and devices too), and who the last seen time.
type Settings struct {
	Status   Visibility `json:"status_visibility"`
	LastSeen Visibility `json:"last_seen_visibility"`
}

// DebugUser is the unfiltered truth about a user (GET
// /v1/debug/users/{user_id}): why the user shows what it shows.
type DebugUser struct {
	UserID         string        `json:"user_id"`
	Now            time.Time     `json:"now"`
	InMemory       bool          `json:"in_memory"` // the node's hot state holds the user
	Known          bool          `json:"known"`     // in memory or durable
	Status         Status        `json:"status"`    // as the user sees themselves
	PublicStatus   Status        `json:"public_status"`
	Reason         string        `json:"reason"` // why, in a sentence
	ManualStatus   *Status       `json:"manual_status"`
	StatusText     string        `json:"status_text"`
	LastSeen       *time.Time    `json:"last_seen"`
	PublicLastSeen *time.Time    `json:"public_last_seen"`
	Version        uint64        `json:"version"`
	NextDeadline   *time.Time    `json:"next_deadline"`
	Devices        []DebugDevice `json:"devices"`
	Settings       Settings      `json:"settings"`
	Rules          DebugRules    `json:"rules"`
	// Viewer is what the viewer DebugAs named sees of the user, and why;
	// nil without one.
	Viewer *DebugViewer `json:"viewer,omitempty"`
}

// DebugViewer is one viewer's view of a user (DebugAs): exactly what a
// read by that viewer answers (Presence), the relation it was filtered
// by, and why.
type DebugViewer struct {
	ViewerID string `json:"viewer_id"`
	// Relation is "self" (the viewer is the user), "contact" (the viewer
	// is in the user's contact list) or "other".
	Relation string `json:"relation"`
	Sees     View   `json:"sees"`
	Why      string `json:"why"` // in a sentence: settings, relation, invisibility
}

// DebugDevice is one device of a DebugUser.
type DebugDevice struct {
	DeviceID   string     `json:"device_id"`
	LastBeat   time.Time  `json:"last_beat"`
	LastActive *time.Time `json:"last_active"` // nil: never, or held active by its owner
	ExpiresAt  *time.Time `json:"expires_at"`  // nil: owned by the node holding its socket
	Alive      bool       `json:"alive"`
	Active     bool       `json:"active"`
	Owner      uint64     `json:"owner,omitempty"` // the lease of the node holding its socket
}

// AdminStats are the numbers of the operator page (GET /v1/admin/stats):
// the nodes the answering node knows of, itself first, and its counters
// and gauges by name, read at Now. Rates come from two reads.
type AdminStats struct {
	Now   time.Time   `json:"now"`
	NowMs int64       `json:"now_ms"` // Now in milliseconds since the Unix epoch
	Nodes []AdminNode `json:"nodes"`
	// Metrics are every presenced_* series and a few of the process's by
	// name: a series with labels as name{label="value",…}, its family's
	// sum as name, a histogram as name_count and name_sum.
	Metrics map[string]float64 `json:"metrics"`
}

// AdminNode is one node of the deployment as the answering node knows it.
type AdminNode struct {
	ID    string `json:"id"`              // its name; empty if unknown
	Lease uint64 `json:"lease,omitempty"` // its lease in the state store (Redis); 0: none
	Self  bool   `json:"self"`            // the node that answered
	Mode  string `json:"mode,omitempty"`  // its backends ("embedded", "redis+postgres+nats"); this node only
	// Health is "ready" or "not_ready" (this node: its readiness checks),
	// "alive" (another node heard from within the lease timeout),
	// "silent" (not heard from: it will be taken over) or "taken_over".
	Health string            `json:"health"`
	Checks map[string]string `json:"checks,omitempty"` // this node: part → "ok", "unavailable", or for nats "stream_missing" / "stream_behind"
	Detail string            `json:"detail"`           // how the answering node knows, in words
	// LeaseRenewed is the node's last lease renewal (its own clock),
	// BeaconAgeMs how long ago its last beacon was heard; nil: unknown.
	LeaseRenewed *time.Time `json:"lease_renewed"`
	BeaconAgeMs  *int64     `json:"beacon_age_ms"`
	Started      *time.Time `json:"started,omitempty"` // this node: when it started
}

// DebugRules are the node's timing rules.
type DebugRules struct {
	TTLMillis       int64 `json:"ttl_ms"`
	IdleAfterMillis int64 `json:"idle_after_ms"`
}

// Error is a refusal of the node: its HTTP status, its stable code (e.g.
// "invalid_id", "forbidden", "rate_limited", "unavailable", "busy"), its
// message for people, and how long it asked the caller to wait (the
// Retry-After of a 429 or 503; zero if it named none).
type Error struct {
	Status     int
	Code       string
	Message    string
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("presenced: %d %s", e.Status, e.Message)
	}
	return fmt.Sprintf("presenced: %d %s: %s", e.Status, e.Code, e.Message)
}

// Temporary reports whether the same request may succeed later: a 429 or
// a 503 (nothing was changed).
func (e *Error) Temporary() bool {
	return e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable
}

// maxAnswer bounds what a Client reads of an answer: 1,000 views are
// about 200 KB, a debug view of 32 devices a few.
const maxAnswer = 16 << 20

// do sends one request and decodes its JSON answer into out (nil: none).
// auth says whether to send the API key.
func (c *Client) do(ctx context.Context, method, path string, in, out any, auth bool) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("presenced: %s %s: encoding the request: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("presenced: %s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth && c.authz != "" {
		req.Header.Set("Authorization", c.authz)
	}
	res, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("presenced: %s %s: %w", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxAnswer+1))
	if err != nil {
		return fmt.Errorf("presenced: %s %s: reading the answer: %w", method, path, err)
	}
	if len(b) > maxAnswer {
		return fmt.Errorf("presenced: %s %s: the answer is larger than %d bytes", method, path, maxAnswer)
	}
	if res.StatusCode != http.StatusOK {
		return answerError(res, b)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("presenced: %s %s: decoding the answer: %w", method, path, err)
	}
	return nil
}

// answerError is the *Error of a refusal. An answer without the node's
// JSON error (a proxy's page) keeps its status, no code and a piece of
// its body.
func answerError(res *http.Response, body []byte) *Error {
	e := &Error{Status: res.StatusCode, RetryAfter: retryAfter(res.Header.Get("Retry-After"), time.Now())}
	var wire struct {
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &wire) == nil && wire.Error != nil && wire.Error.Code != "" {
		e.Code, e.Message = wire.Error.Code, wire.Error.Message
		return e
	}
	msg := strings.TrimSpace(string(body))
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	e.Message = http.StatusText(res.StatusCode)
	if msg != "" {
		e.Message += ": " + msg
	}
	return e
}

// retryAfter parses a Retry-After value: seconds, or an HTTP date (RFC
// 9110 §10.2.3) counted from now. Anything else is zero.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// user is the path segment of a user or contact id.
func user(id string) (string, error) {
	if id == "" {
		return "", errors.New("presenced: a user id is required")
	}
	return url.PathEscape(id), nil
}

// --- reads ---

// Statuses reads the statuses of up to 1,000 users with the seed
// endpoint (GET /presence/batch): each id → its status, nil when hidden
// from viewer. An empty viewer is the anonymous everyone-view. The ids
// go in the URL (the node takes 32 KiB of request line and headers): use
// Batch for many long ids.
func (c *Client) Statuses(ctx context.Context, ids []string, viewer string) (map[string]*Status, error) {
	for _, id := range ids {
		if id == "" || strings.Contains(id, ",") {
			return nil, fmt.Errorf("presenced: user id %q: ids are not empty and have no commas", id)
		}
	}
	// The commas stay literal: 1,000 ids must fit in the request line.
	var q strings.Builder
	q.WriteString("/presence/batch?user_ids=")
	for i, id := range ids {
		if i > 0 {
			q.WriteByte(',')
		}
		q.WriteString(url.QueryEscape(id))
	}
	if viewer != "" {
		q.WriteString("&viewer_id=" + url.QueryEscape(viewer))
	}
	out := map[string]*Status{}
	if err := c.do(ctx, http.MethodGet, q.String(), nil, &out, true); err != nil {
		return nil, err
	}
	return out, nil
}

// Batch reads the views of up to 1,000 users as viewer sees them (POST
// /v1/presence/batch), keyed by id. An empty viewer is the anonymous
// everyone-view.
func (c *Client) Batch(ctx context.Context, ids []string, viewer string) (map[string]View, error) {
	req := struct {
		UserIDs  []string `json:"user_ids"`
		ViewerID string   `json:"viewer_id,omitempty"`
	}{ids, viewer}
	if req.UserIDs == nil {
		req.UserIDs = []string{}
	}
	out := map[string]View{}
	if err := c.do(ctx, http.MethodPost, "/v1/presence/batch", req, &out, true); err != nil {
		return nil, err
	}
	return out, nil
}

// Presence reads the view of one user as viewer sees it (GET
// /v1/presence/{user_id}). An empty viewer is the anonymous
// everyone-view.
func (c *Client) Presence(ctx context.Context, userID, viewer string) (View, error) {
	var v View
	p, err := user(userID)
	if err != nil {
		return v, err
	}
	path := "/v1/presence/" + p
	if viewer != "" {
		path += "?" + url.Values{"viewer_id": {viewer}}.Encode()
	}
	err = c.do(ctx, http.MethodGet, path, nil, &v, true)
	return v, err
}

// Public reads what a user shows to everyone (GET /v1/public/{user_id}),
// without the API key: the answer may come from a CDN's cache.
func (c *Client) Public(ctx context.Context, userID string) (View, error) {
	var v View
	p, err := user(userID)
	if err != nil {
		return v, err
	}
	err = c.do(ctx, http.MethodGet, "/v1/public/"+p, nil, &v, false)
	return v, err
}

// --- writes for a user's devices ---

// Heartbeat says that a device of a user is alive, and whether the user
// is active on it (POST /v1/heartbeat). It answers the user's own view.
func (c *Client) Heartbeat(ctx context.Context, userID, deviceID string, active bool) (SelfView, error) {
	req := struct {
		UserID   string `json:"user_id"`
		DeviceID string `json:"device_id"`
		Active   bool   `json:"active"`
	}{userID, deviceID, active}
	var v SelfView
	err := c.do(ctx, http.MethodPost, "/v1/heartbeat", req, &v, true)
	return v, err
}

// SetStatus sets a user's manual status (Away, Busy, Invisible) or clears
// it (Online), with a status text of at most 140 characters ("" clears
// it) (POST /v1/status). It answers the user's own view.
func (c *Client) SetStatus(ctx context.Context, userID string, status Status, text string) (SelfView, error) {
	req := struct {
		UserID string `json:"user_id"`
		Status Status `json:"status"`
		Text   string `json:"text,omitempty"`
	}{userID, status, text}
	var v SelfView
	err := c.do(ctx, http.MethodPost, "/v1/status", req, &v, true)
	return v, err
}

// Bye ends a device of a user now (POST /v1/bye). It answers the user's
// own view.
func (c *Client) Bye(ctx context.Context, userID, deviceID string) (SelfView, error) {
	req := struct {
		UserID   string `json:"user_id"`
		DeviceID string `json:"device_id"`
	}{userID, deviceID}
	var v SelfView
	err := c.do(ctx, http.MethodPost, "/v1/bye", req, &v, true)
	return v, err
}

// --- rooms ---

// Room is a room after a join or leave: its members (invisible users are
// not counted) and its version, which grows with every join and leave of
// a member.
type Room struct {
	Room    string `json:"room"`
	Count   int    `json:"count"`
	Version uint64 `json:"version"`
}

// RoomPage is a page of a room's members as a viewer sees them.
type RoomPage struct {
	Room  string `json:"room"`
	Count int    `json:"count"` // members of the whole room
	// Members maps each member of this page to its status, nil when it
	// is hidden from the viewer.
	Members map[string]*Status `json:"members"`
	// Next is the after of the following page; "" on the last.
	Next    string `json:"next"`
	Version uint64 `json:"version"`
}

// room is the path of a room.
func room(id string) (string, error) {
	if id == "" {
		return "", errors.New("presenced: a room id is required")
	}
	return "/v1/rooms/" + url.PathEscape(id), nil
}

func (c *Client) roomOp(ctx context.Context, op, roomID, userID, deviceID string) (Room, error) {
	var r Room
	p, err := room(roomID)
	if err != nil {
		return r, err
	}
	req := struct {
		UserID   string `json:"user_id"`
		DeviceID string `json:"device_id"`
	}{userID, deviceID}
	err = c.do(ctx, http.MethodPost, p+"/"+op, req, &r, true)
	return r, err
}

// Join puts a device of a user in a room (POST /v1/rooms/{room}/join)
// until it leaves, says bye or ends; the device must be alive (a
// heartbeat or a connect first: 409 device_not_alive). It answers the
// room after the join.
func (c *Client) Join(ctx context.Context, roomID, userID, deviceID string) (Room, error) {
	return c.roomOp(ctx, "join", roomID, userID, deviceID)
}

// Leave takes a device of a user out of a room (POST
// /v1/rooms/{room}/leave). It answers the room after the leave.
func (c *Client) Leave(ctx context.Context, roomID, userID, deviceID string) (Room, error) {
	return c.roomOp(ctx, "leave", roomID, userID, deviceID)
}

// Room reads a page of up to limit members of a room (1 to 1,000; 0:
// the node's default, 100) after the member after ("" for the first
// page), as viewer sees them (GET /v1/rooms/{room}). An empty viewer is
// the anonymous everyone-view.
func (c *Client) Room(ctx context.Context, roomID, after string, limit int, viewer string) (RoomPage, error) {
	var pg RoomPage
	p, err := room(roomID)
	if err != nil {
		return pg, err
	}
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if limit != 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if viewer != "" {
		q.Set("viewer_id", viewer)
	}
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	var wire struct {
		RoomPage
		Next *string `json:"next"`
	}
	if err := c.do(ctx, http.MethodGet, p, nil, &wire, true); err != nil {
		return pg, err
	}
	pg = wire.RoomPage
	if wire.Next != nil {
		pg.Next = *wire.Next
	}
	return pg, nil
}

// RoomCounts reads the member counts of up to 1,000 rooms (GET
// /v1/rooms?ids=), keyed by room id.
func (c *Client) RoomCounts(ctx context.Context, roomIDs []string) (map[string]int, error) {
	for _, id := range roomIDs {
		if id == "" || strings.Contains(id, ",") {
			return nil, fmt.Errorf("presenced: room id %q: ids are not empty and have no commas", id)
		}
	}
	var q strings.Builder
	q.WriteString("/v1/rooms?ids=")
	for i, id := range roomIDs {
		if i > 0 {
			q.WriteByte(',')
		}
		q.WriteString(url.QueryEscape(id))
	}
	out := map[string]int{}
	if err := c.do(ctx, http.MethodGet, q.String(), nil, &out, true); err != nil {
		return nil, err
	}
	return out, nil
}

// --- a user's account ---

// Settings reads a user's privacy settings.
func (c *Client) Settings(ctx context.Context, userID string) (Settings, error) {
	var s Settings
	p, err := user(userID)
	if err != nil {
		return s, err
	}
	err = c.do(ctx, http.MethodGet, "/v1/users/"+p+"/settings", nil, &s, true)
	return s, err
}

// SetSettings replaces a user's privacy settings; both are required. It
// answers the settings as stored.
func (c *Client) SetSettings(ctx context.Context, userID string, s Settings) (Settings, error) {
	var out Settings
	p, err := user(userID)
	if err != nil {
		return out, err
	}
	err = c.do(ctx, http.MethodPut, "/v1/users/"+p+"/settings", s, &out, true)
	return out, err
}

type contactList struct {
	Contacts []string `json:"contacts"`
}

// contacts sends one request about userID's contact list and returns
// the list as stored.
func (c *Client) contacts(ctx context.Context, method, userID, contactID string, in *contactList) ([]string, error) {
	p, err := user(userID)
	if err != nil {
		return nil, err
	}
	path := "/v1/users/" + p + "/contacts"
	if contactID != "" {
		path += "/" + url.PathEscape(contactID)
	}
	var out contactList
	if in != nil {
		if in.Contacts == nil {
			in.Contacts = []string{}
		}
		err = c.do(ctx, method, path, in, &out, true)
	} else {
		err = c.do(ctx, method, path, nil, &out, true)
	}
	if err != nil {
		return nil, err
	}
	if out.Contacts == nil {
		out.Contacts = []string{}
	}
	return out.Contacts, nil
}

// Contacts reads a user's contact list: the users who see what the user
// shows to contacts.
func (c *Client) Contacts(ctx context.Context, userID string) ([]string, error) {
	return c.contacts(ctx, http.MethodGet, userID, "", nil)
}

// SetContacts replaces a user's contact list (at most 10,000; empty
// clears it) and returns it as stored.
func (c *Client) SetContacts(ctx context.Context, userID string, contacts []string) ([]string, error) {
	return c.contacts(ctx, http.MethodPut, userID, "", &contactList{contacts})
}

// AddContacts adds users to a user's contact list and returns it as
// stored.
func (c *Client) AddContacts(ctx context.Context, userID string, contacts ...string) ([]string, error) {
	return c.contacts(ctx, http.MethodPost, userID, "", &contactList{contacts})
}

// AddContact adds one user to a user's contact list and returns it as
// stored.
func (c *Client) AddContact(ctx context.Context, userID, contactID string) ([]string, error) {
	if contactID == "" {
		return nil, errors.New("presenced: a contact id is required")
	}
	return c.contacts(ctx, http.MethodPut, userID, contactID, nil)
}

// RemoveContact removes one user from a user's contact list and returns
// it as stored.
func (c *Client) RemoveContact(ctx context.Context, userID, contactID string) ([]string, error) {
	if contactID == "" {
		return nil, errors.New("presenced: a contact id is required")
	}
	return c.contacts(ctx, http.MethodDelete, userID, contactID, nil)
}

// --- operations ---

// Debug reads why a user shows what it shows: devices, deadlines, manual
// status, version, settings (GET /v1/debug/users/{user_id}).
func (c *Client) Debug(ctx context.Context, userID string) (DebugUser, error) {
	return c.DebugAs(ctx, userID, "")
}

// DebugAs is Debug with what viewer sees of the user, and why
// (DebugUser.Viewer): exactly what Presence answers viewer, its relation
// to the user and the settings that decide it. An empty viewer is Debug.
func (c *Client) DebugAs(ctx context.Context, userID, viewer string) (DebugUser, error) {
	var d DebugUser
	p, err := user(userID)
	if err != nil {
		return d, err
	}
	path := "/v1/debug/users/" + p
	if viewer != "" {
		path += "?" + url.Values{"viewer_id": {viewer}}.Encode()
	}
	err = c.do(ctx, http.MethodGet, path, nil, &d, true)
	return d, err
}

// AdminStats reads the numbers of the operator page (GET
// /v1/admin/stats): the node's health and readiness checks, the other
// nodes it knows of, and its counters and gauges by name.
func (c *Client) AdminStats(ctx context.Context) (AdminStats, error) {
	var s AdminStats
	err := c.do(ctx, http.MethodGet, "/v1/admin/stats", nil, &s, true)
	return s, err
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gobwas/ws"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/wsframe"
)

// The WebSocket client shared by the fanout and churn scenarios: one
// connection is a benchConn whose frames are read by one goroutine (its
// owner's) and written by any, under a mutex.

// wsEndpoint is one presenced node and how to prove a user to it.
type wsEndpoint struct {
	url    *url.URL // ws://127.x.y.z:port/v1/ws
	dev    bool     // bare user_id
	secret string   // else an HS256 token per connection
}

// endpoints parses the -url values (repeated or comma-separated) into
// loopback endpoints.
// resolveEndpoints turns the -url flags (none: defaultURL) into
// endpoints, and their URLs as the results print them. Without -dev and
// -jwt-secret, the secret comes from $PRESENCE_BENCH_JWT_SECRET.
func resolveEndpoints(urls urlList, dev bool, secret string) ([]wsEndpoint, []string, error) {
	if len(urls) == 0 {
		urls = urlList{defaultURL}
	}
	if secret == "" && !dev {
		secret = os.Getenv(jwtSecretEnv)
	}
	eps, err := endpoints(urls, dev, secret)
	if err != nil {
		return nil, nil, err
	}
	strs := make([]string, len(eps))
	for i, e := range eps {
		strs[i] = e.url.String()
	}
	return eps, strs, nil
}

func endpoints(raws []string, dev bool, secret string) ([]wsEndpoint, error) {
	var out []wsEndpoint
	for _, r := range raws {
		for p := range strings.SplitSeq(r, ",") {
			p = strings.TrimSpace(p)
			if p == "" {
				continue
			}
			u, _, err := loopbackURL(p)
			if err != nil {
				return nil, err
			}
			out = append(out, wsEndpoint{url: u, dev: dev, secret: secret})
		}
	}
	if len(out) == 0 {
		return nil, errors.New("give -url")
	}
	if len(out) > 16 {
		return nil, fmt.Errorf("%d URLs: at most 16", len(out))
	}
	if dev == (secret != "") {
		return nil, errors.New("give exactly one of -dev (bare user_id) and -jwt-secret (signed tokens)")
	}
	return out, nil
}

// urlList is a repeatable string flag.
type urlList []string

func (l *urlList) String() string     { return strings.Join(*l, ",") }
func (l *urlList) Set(s string) error { *l = append(*l, s); return nil }

// wsMsg is the part of a server message the scenarios read.
type wsMsg struct {
	Type         string              `json:"type"`
	UserID       string              `json:"user_id"`
	DeviceID     string              `json:"device_id"`
	Status       *string             `json:"status"` // null: hidden
	Version      uint64              `json:"version"`
	TTLMs        int64               `json:"ttl_ms"`
	HeartbeatMs  int64               `json:"heartbeat_interval_ms"`
	CloseGraceMs *int64              `json:"close_grace_ms"` // nil: not announced
	Code         string              `json:"code"`
	Message      string              `json:"message"`
	Users        map[string]snapUser `json:"users"`
	Room         string              `json:"room"`        // room, room_change
	Event        string              `json:"event"`       // room_change: join, leave, status
	Count        int                 `json:"count"`       // room, room_change, room_interval
	Mode         string              `json:"mode"`        // room: events or interval
	Joined       []string            `json:"joined"`      // room_interval
	Left         []string            `json:"left"`        // room_interval
	MoreJoined   int                 `json:"more_joined"` // room_interval
	MoreLeft     int                 `json:"more_left"`   // room_interval
	Unchanged    int                 `json:"unchanged"`   // snapshot of a subscribe with known versions
	size         int                 // bytes of the message
}

// snapUser is one user of a snapshot.
type snapUser struct {
	Status  *string `json:"status"`
	Version uint64  `json:"version"`
}

// benchConn is one WebSocket connection. Reads belong to one goroutine;
// send is safe for concurrent use.
type benchConn struct {
	nc      net.Conn
	rd      io.Reader
	welcome wsMsg

	wmu sync.Mutex // serialises frames
}

// closeError is a close frame from the server.
type closeError struct {
	code   ws.StatusCode
	reason string
}

func (e *closeError) Error() string {
	return fmt.Sprintf("closed by the server: %d %s", e.code, e.reason)
}

// dial opens a connection of user's device and reads its welcome.
func (e wsEndpoint) dial(ctx context.Context, user, device string) (*benchConn, error) {
	return e.dialWith(ctx, user, device, nil)
}

// dialWith is dial through netDial (nil: the dialer's own).
func (e wsEndpoint) dialWith(ctx context.Context, user, device string, netDial func(ctx context.Context, network, addr string) (net.Conn, error)) (*benchConn, error) {
	u := *e.url
	q := url.Values{}
	if e.dev {
		q.Set("user_id", user)
	} else {
		// Every room: the rooms scenario joins and watches one.
		tok, err := auth.Token{User: user, Rooms: []string{"*"}}.Sign([]byte(e.secret), time.Now(), 3*time.Hour)
		if err != nil {
			return nil, err
		}
		q.Set("token", tok)
	}
	if device != "" {
		q.Set("device_id", device)
	}
	u.RawQuery = q.Encode()
	nc, br, _, err := ws.Dialer{Timeout: 10 * time.Second, NetDial: netDial}.Dial(ctx, u.String())
	if err != nil {
		return nil, fmt.Errorf("dial %s as %s: %w", e.url.Host, user, err)
	}
	c := &benchConn{nc: nc, rd: bufio.NewReaderSize(nc, 4096)}
	if br != nil {
		c.rd = br
	}
	m, err := c.read(time.Now().Add(10 * time.Second))
	if err == nil && m.Type != "welcome" {
		err = fmt.Errorf("first message is %q, not a welcome", m.Type)
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("%s as %s: welcome: %w", e.url.Host, user, err)
	}
	c.welcome = *m
	return c, nil
}

// ttl and beat are what the welcome announced (beat: ttl/3 when absent).
func (c *benchConn) ttl() time.Duration { return time.Duration(c.welcome.TTLMs) * time.Millisecond }

// closeGrace is how long the server keeps a device whose connection
// closed without a bye: 0 if it announces 0 (no grace), its ttl if it
// announces none.
func (c *benchConn) closeGrace() time.Duration {
	if c.welcome.CloseGraceMs == nil {
		return c.ttl()
	}
	if g := time.Duration(*c.welcome.CloseGraceMs) * time.Millisecond; g >= 0 && g < c.ttl() {
		return g
	}
	return c.ttl()
}

func (c *benchConn) beat() time.Duration {
	if c.welcome.HeartbeatMs > 0 {
		return time.Duration(c.welcome.HeartbeatMs) * time.Millisecond
	}
	return c.ttl() / 3
}

// read returns the next text message, skipping pings and pongs; a zero
// deadline waits for ever.
func (c *benchConn) read(deadline time.Time) (*wsMsg, error) {
	for {
		_ = c.nc.SetReadDeadline(deadline)
		f, err := wsframe.Read(c.rd)
		if err != nil {
			return nil, err
		}
		switch f.Header.OpCode {
		case ws.OpText:
			m := &wsMsg{size: len(f.Payload)}
			if err := json.Unmarshal(f.Payload, m); err != nil {
				return nil, fmt.Errorf("bad message %.80q: %w", f.Payload, err)
			}
			return m, nil
		case ws.OpClose:
			code, reason := ws.ParseCloseFrameData(f.Payload)
			return nil, &closeError{code: code, reason: reason}
		case ws.OpPing, ws.OpPong:
			continue
		default:
			return nil, fmt.Errorf("unexpected frame %v", f.Header.OpCode)
		}
	}
}

// send writes one text message.
func (c *benchConn) send(msg []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	return ws.WriteFrame(c.nc, ws.MaskFrame(ws.NewTextFrame(msg)))
}

// sendAt writes one text message and returns when the write began.
func (c *benchConn) sendAt(msg []byte) (time.Time, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	f := ws.MaskFrame(ws.NewTextFrame(msg))
	// The clock starts before the write: under load the writer may run
	// again only after a watcher has read the change.
	at := time.Now()
	err := ws.WriteFrame(c.nc, f)
	return at, err
}

// drop closes the TCP connection without a close frame or bye.
func (c *benchConn) drop() { c.nc.Close() }

var (
	msgHeartbeat = []byte(`{"type":"heartbeat"}`)
	msgBusy      = []byte(`{"type":"set_status","status":"busy"}`)
	msgOnline    = []byte(`{"type":"set_status","status":"online"}`)
)

// subscribeKnownMsg is a subscribe of ids that says which versions of
// them the client holds (known: those of ids only; none: no field).
func subscribeKnownMsg(ids []string, known map[string]uint64) []byte {
	var k map[string]uint64
	for _, id := range ids {
		if v, ok := known[id]; ok {
			if k == nil {
				k = make(map[string]uint64)
			}
			k[id] = v
		}
	}
	b, _ := json.Marshal(struct {
		Type    string            `json:"type"`
		UserIDs []string          `json:"user_ids"`
		Known   map[string]uint64 `json:"known,omitempty"`
	}{"subscribe", ids, k})
	return b
}

// beatLoop heartbeats on c every interval until ctx is done or a write
// fails.
func beatLoop(ctx context.Context, c *benchConn, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if c.send(msgHeartbeat) != nil {
				return
			}
		}
	}
}

// latSet is a set of latency samples with exact percentiles (the runs are
// bounded, so every sample is kept).
type latSet struct {
	d      []time.Duration
	sorted bool
}

func (l *latSet) add(d time.Duration) { l.d = append(l.d, d); l.sorted = false }

func (l *latSet) n() int { return len(l.d) }

// pct returns the q-quantile (0 ≤ q ≤ 1) by nearest rank; 0 without samples.
func (l *latSet) pct(q float64) time.Duration {
	if len(l.d) == 0 {
		return 0
	}
	if !l.sorted {
		slices.Sort(l.d)
		l.sorted = true
	}
	i := int(math.Ceil(q*float64(len(l.d)))) - 1
	return l.d[max(0, min(i, len(l.d)-1))]
}

// latSummary is the JSON form of a latency distribution, in milliseconds.
type latSummary struct {
	Samples int     `json:"samples"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	P999    float64 `json:"p999_ms"`
	Max     float64 `json:"max_ms"`
}

func (l *latSet) summary() latSummary {
	ms := func(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }
	return latSummary{Samples: l.n(), P50: ms(l.pct(0.5)), P99: ms(l.pct(0.99)), P999: ms(l.pct(0.999)), Max: ms(l.pct(1))}
}

// runTag is a short random tag that keeps the users of one run apart from
// those of earlier runs against the same server.
func runTag() string {
	return fmt.Sprintf("%04x", time.Now().UnixNano()&0xffff)
}

// Package peers lets the nodes of a deployment ask each other, over core
// NATS, what they hold in memory of users' devices: the tracker's
// Config.Peers. A node reads a user degraded when the state store (Redis)
// cannot answer for them — it is down, the node is cut off from it, or the
// Cluster master holding the user is — and what it knows of its own is
// then only its own sockets and outage buffer. The devices that keep
// beating on the other nodes are alive all the same (each node keeps the
// devices whose sockets it holds alive, and buffers the HTTP beats it
// takes); asked, those nodes say so, and nobody who kept beating reads
// offline.
//
// A question is one request on "<subject>" with up to ChunkIDs ids; every
// node subscribed answers from its tracker (tracker.Tracker.Signs) on the
// asker's inbox, naming its lease. The asker waits until every other node
// it knows alive (Config.Live: the beacons heard) answered every chunk, or
// Config.Timeout: a slow or silent node is read without. Nothing is
// stored; a question costs the answering nodes a look-up per id in memory.
package peers

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/jsstream"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tracker"
)

// ChunkIDs is the most ids one request carries: an answer for that many
// users, each with a few devices, stays far under NATS's default 1 MB
// payload. Not every user: 100 users of presence.DefaultMaxDevices devices
// of ids of presence.MaxIDLen bytes, each device with its beats and a bye
// both in the outage buffer and on a socket, already take more; an answer
// too large leaves out the users with the most signs (Serve).
const ChunkIDs = 100

// DefaultTimeout is Config.Timeout's default.
const DefaultTimeout = 250 * time.Millisecond

// Source is what a node answers from: its tracker.
type Source interface {
	LeaseID() uint64
	Signs(now int64, ids []string, out []tracker.DeviceSign) []tracker.DeviceSign
	StoreSnapshots(ctx context.Context, now int64, ids []string, out []presence.Snapshot) []presence.Snapshot
}

// Config configures Peers. Zero values take the documented defaults.
type Config struct {
	Conn *jsstream.Conn // required: the node's NATS connection
	// Live returns the leases of the nodes known alive (the beacon's),
	// this node's included or not: the nodes an asker waits for.
	Live func() []uint64
	// Subject of the questions. Default "presence.peers".
	Subject string
	// Timeout bounds how long a question waits for the answers. Default
	// DefaultTimeout.
	Timeout time.Duration
	Clock   clock.Clock
	Logger  *slog.Logger
}

// Peers asks the other nodes and answers them. Safe for concurrent use.
type Peers struct {
	cfg Config
	id  uint64                 // names this node's questions (random): it does not answer them, with a lease or not
	src atomic.Pointer[Source] // what Serve answers from; its lease is not waited for
	// stats
	asked, answered, timeouts, bad, late atomic.Uint64
}

// Stats are counters since start.
type Stats struct {
	Asked    uint64 // questions this node asked (one per chunk)
	Answered uint64 // questions of other nodes this node answered
	Timeouts uint64 // questions that ended before every live node answered
	Bad      uint64 // questions or answers that could not be decoded (dropped)
	Late     uint64 // questions of other nodes not answered: this node was too far behind (Serve)
}

// New returns Peers that can ask; Serve answers.
func New(cfg Config) (*Peers, error) {
	if cfg.Conn == nil || cfg.Live == nil {
		return nil, errors.New("peers: Conn and Live are required")
	}
	if cfg.Subject == "" {
		cfg.Subject = "presence.peers"
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Peers{cfg: cfg, id: rand.Uint64() | 1}, nil
}

// Stats returns the counters.
func (p *Peers) Stats() Stats {
	return Stats{Asked: p.asked.Load(), Answered: p.answered.Load(), Timeouts: p.timeouts.Load(), Bad: p.bad.Load(), Late: p.late.Load()}
}

// Serve answers the other nodes' questions from src until ctx is done.
// The answers are made on NATS's delivery goroutine of the subscription,
// one at a time. A node more than Timeout/2 of answers behind (the
// questions waiting times the time an answer takes of late) skips the
// oldest questions until it caught up: their askers (whose Timeout is
// this node's, the deployment's) stop waiting before they would be
// answered, and answering them would only delay those still waiting.
func (p *Peers) Serve(ctx context.Context, src Source) error {
	nc := p.cfg.Conn.NC
	var signs []tracker.DeviceSign
	var snaps []presence.Snapshot
	var buf []byte
	var cost time.Duration // the time a message takes, a moving average
	sub, err := nc.Subscribe(p.cfg.Subject, func(m *nats.Msg) {
		if n, _, err := m.Sub.Pending(); err == nil && time.Duration(n)*cost > p.cfg.Timeout/2 {
			p.late.Add(1)
			return
		}
		start := time.Now()
		defer func() { cost += (time.Since(start) - cost) / 8 }()
		asker, ids, withStore, err := decodeQuestion(m.Data)
		if err != nil {
			p.bad.Add(1)
			return
		}
		if m.Reply == "" || asker == p.id {
			return // its own question: it knows
		}
		now := p.cfg.Clock.Now().UnixMilli()
		signs = src.Signs(now, ids, signs[:0])
		clear(snaps)
		snaps = snaps[:0]
		if withStore {
			snaps = src.StoreSnapshots(ctx, now, ids, snaps)
		}
		buf = encodeAnswer(buf[:0], src.LeaseID(), ids, signs, snaps)
		for len(buf) > int(nc.MaxPayload()) {
			// One user can hold many signs (device ids cycled through
			// over HTTP during an outage): leave out the user with the
			// most, so that the others of the chunk are answered.
			if len(signs) == 0 {
				p.cfg.Logger.Warn("answer to a peer too large; not sent", "bytes", len(buf), "ids", len(ids))
				return
			}
			var user string
			var n int
			signs, user, n = dropLargest(signs)
			p.cfg.Logger.Warn("a user's signs too many to answer a peer; left out", "user", user, "signs", n)
			buf = encodeAnswer(buf[:0], src.LeaseID(), ids, signs, snaps)
		}
		if err := m.Respond(buf); err == nil {
			p.answered.Add(1)
		}
	})
	if err != nil {
		return fmt.Errorf("peers: subscribe: %w", err)
	}
	p.src.Store(&src)
	<-ctx.Done()
	return sub.Unsubscribe()
}

// dropLargest removes from signs those of the user with the most of them,
// and returns what is left, that user and how many were removed.
func dropLargest(signs []tracker.DeviceSign) ([]tracker.DeviceSign, string, int) {
	count := make(map[string]int)
	var user string
	for _, s := range signs {
		count[s.User]++
		if count[s.User] > count[user] {
			user = s.User
		}
	}
	kept := slices.DeleteFunc(signs, func(s tracker.DeviceSign) bool { return s.User == user })
	return kept, user, count[user]
}

// Ask asks every other node about ids (any number; sent ChunkIDs at a
// time) and returns their answers, once every other live node answered
// every chunk or Config.Timeout (or ctx) ended the wait. It fails only
// when the question could not be sent, or this node is not connected to
// NATS.
func (p *Peers) Ask(ctx context.Context, ids []string, withStore bool) (tracker.Answers, error) {
	var out tracker.Answers
	nc := p.cfg.Conn.NC
	if !nc.IsConnected() {
		// Said even when no node is known alive: cut off, this node
		// hears no beacon either.
		return out, errors.New("peers: not connected to NATS")
	}
	var self uint64
	if src := p.src.Load(); src != nil {
		self = (*src).LeaseID()
	}
	expect := make(map[uint64]int) // lease → chunks still to answer
	for _, l := range p.cfg.Live() {
		if l != self && l != 0 {
			expect[l] = 0
		}
	}
	if len(expect) == 0 || len(ids) == 0 {
		return out, nil // nobody to ask
	}
	// Each user once: a read may name one many times.
	asked := make(map[string]bool, len(ids))
	uniq := make([]string, 0, len(ids))
	for _, id := range ids {
		if !asked[id] {
			asked[id] = true
			uniq = append(uniq, id)
		}
	}
	ids = uniq
	chunks := (len(ids) + ChunkIDs - 1) / ChunkIDs
	for l := range expect {
		expect[l] = chunks
	}
	inbox := nc.NewRespInbox()
	// Answers are handed over one by one, however many come (nodes not
	// heard yet, nodes without a lease answer too): a channel
	// subscription that fills up is a slow consumer, which natsbus takes
	// for lost changes (it resyncs every watcher).
	ch := make(chan *nats.Msg, len(expect))
	done := make(chan struct{})
	defer close(done)
	sub, err := nc.Subscribe(inbox, func(m *nats.Msg) {
		select {
		case ch <- m:
		case <-done:
		}
	})
	if err != nil {
		return out, fmt.Errorf("peers: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return out, fmt.Errorf("peers: %w", err)
	}
	var q []byte
	for c := range chunks {
		part := ids[c*ChunkIDs : min(len(ids), (c+1)*ChunkIDs)]
		q = encodeQuestion(q[:0], p.id, part, withStore)
		if err := nc.PublishMsg(&nats.Msg{Subject: p.cfg.Subject, Reply: inbox, Data: q}); err != nil {
			return out, fmt.Errorf("peers: ask: %w", err)
		}
		p.asked.Add(1)
	}
	timer := time.NewTimer(p.cfg.Timeout)
	defer timer.Stop()
	waiting := len(expect)
	for waiting > 0 {
		select {
		case m := <-ch:
			lease, err := decodeAnswer(m.Data, asked, &out)
			if err != nil {
				p.bad.Add(1)
				continue
			}
			if left, ok := expect[lease]; ok && left > 0 {
				expect[lease] = left - 1
				if left == 1 {
					waiting--
				}
			}
		case <-timer.C:
			p.timeouts.Add(1)
			return out, nil
		case <-ctx.Done():
			return out, nil
		}
	}
	return out, nil
}

// The encodings. A question: version, the asker's id (Peers.id), flags
// (1: withStore), the ids. An answer: answerVersion, the answerer's lease,
// the ids of the question again (the asker keeps no state per chunk), the
// signs, each naming its user by its index among those ids, and the
// snapshots the answerer read in its store, likewise.

const (
	version       = 2 // of a question: 1 had no flags (withStore)
	answerVersion = 2 // of an answer: 1 had no snapshots
)

var errBad = errors.New("peers: malformed message")

func encodeQuestion(b []byte, asker uint64, ids []string, withStore bool) []byte {
	b = append(b, version)
	b = binary.AppendUvarint(b, asker)
	var flags byte
	if withStore {
		flags = 1
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = binary.AppendUvarint(b, uint64(len(id)))
		b = append(b, id...)
	}
	return b
}

func decodeQuestion(b []byte) (asker uint64, ids []string, withStore bool, err error) {
	r := reader{b: b}
	if r.byte() != version {
		return 0, nil, false, errBad
	}
	asker = r.uvarint()
	flags := r.byte()
	n := r.uvarint()
	if r.err != nil || n > ChunkIDs || flags > 1 {
		return 0, nil, false, errBad
	}
	ids = make([]string, 0, n)
	for range n {
		id := r.str(presence.MaxIDLen)
		if r.err != nil {
			return 0, nil, false, errBad
		}
		ids = append(ids, id)
	}
	if len(r.b) != 0 {
		return 0, nil, false, errBad
	}
	return asker, ids, flags == 1, nil
}

// encodeAnswer writes signs about ids (the chunk asked), each naming its
// user by its index in ids.
func encodeAnswer(b []byte, lease uint64, ids []string, signs []tracker.DeviceSign, snaps []presence.Snapshot) []byte {
	b = append(b, answerVersion)
	b = binary.AppendUvarint(b, lease)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	// The chunk's ids again, so the asker matches the answer to its chunk
	// without keeping state per request.
	for _, id := range ids {
		b = binary.AppendUvarint(b, uint64(len(id)))
		b = append(b, id...)
	}
	b = binary.AppendUvarint(b, uint64(len(signs)))
	idx := make(map[string]int, len(ids))
	for i, id := range ids {
		idx[id] = i
	}
	for _, s := range signs {
		b = binary.AppendUvarint(b, uint64(idx[s.User]))
		b = binary.AppendUvarint(b, uint64(len(s.Device)))
		b = append(b, s.Device...)
		b = binary.AppendVarint(b, s.At)
		var f byte
		if s.Active {
			f |= 1
		}
		if s.Bye {
			f |= 2
		}
		b = append(b, f)
	}
	b = binary.AppendUvarint(b, uint64(len(snaps)))
	for i := range snaps {
		s := &snaps[i]
		// The manual byte's high bit says that a public face follows the
		// version (an invisible user whose text changed since they
		// vanished: presence.Snapshot.PubText, PubVersion).
		m := byte(s.Manual)
		pubText, pubVersion := s.Public()
		frozen := s.PubVersion != 0 && (pubText != s.Text || pubVersion != s.Version)
		if frozen {
			m |= faceFollows
		}
		b = binary.AppendUvarint(b, uint64(idx[s.UserID]))
		b = append(b, byte(s.Status), m, byte(s.Settings.Status), byte(s.Settings.LastSeen))
		b = binary.AppendUvarint(b, uint64(len(s.Text)))
		b = append(b, s.Text...)
		b = binary.AppendVarint(b, s.LastSeen)
		b = binary.AppendVarint(b, s.PubLastSeen)
		b = binary.AppendUvarint(b, uint64(s.Devices))
		b = binary.AppendUvarint(b, s.Version)
		if frozen {
			b = binary.AppendUvarint(b, uint64(len(pubText)))
			b = append(b, pubText...)
			b = binary.AppendUvarint(b, pubVersion)
		}
	}
	return b
}

// faceFollows is the flag of a snapshot's manual byte that says its
// public text and version follow it.
const faceFollows = 0x80

// decodeAnswer appends the signs and snapshots of an answer to *out,
// keeping only those about users of asked (an answer cannot add users
// nobody asked about), and returns the answerer's lease. A malformed
// answer adds nothing.
func decodeAnswer(b []byte, asked map[string]bool, out *tracker.Answers) (uint64, error) {
	r := reader{b: b}
	if r.byte() != answerVersion {
		return 0, errBad
	}
	lease := r.uvarint()
	n := r.uvarint()
	if r.err != nil || n > ChunkIDs {
		return 0, errBad
	}
	ids := make([]string, 0, n)
	for range n {
		ids = append(ids, r.str(presence.MaxIDLen))
	}
	ns := r.uvarint()
	if r.err != nil || ns > uint64(len(r.b)) { // every sign takes bytes
		return 0, errBad
	}
	start, startSnaps := len(out.Signs), len(out.Snapshots)
	bad := func() (uint64, error) {
		out.Signs, out.Snapshots = out.Signs[:start], out.Snapshots[:startSnaps]
		return 0, errBad
	}
	for range ns {
		i := r.uvarint()
		dev := r.str(presence.MaxIDLen)
		at := r.varint()
		f := r.byte()
		if r.err != nil || i >= uint64(len(ids)) || f > 3 || dev == "" {
			return bad()
		}
		if !asked[ids[i]] {
			continue
		}
		out.Signs = append(out.Signs, tracker.DeviceSign{User: ids[i], Device: dev, At: at, Active: f&1 != 0, Bye: f&2 != 0})
	}
	nn := r.uvarint()
	if r.err != nil || nn > uint64(len(ids)) {
		return bad()
	}
	for range nn {
		i := r.uvarint()
		st, m, ss, sl := r.byte(), r.byte(), r.byte(), r.byte()
		text := r.str(4 * presence.MaxTextLen) // bytes: up to 4 a character
		ls, pls := r.varint(), r.varint()
		devs, v := r.uvarint(), r.uvarint()
		var pubText string
		var pubVersion uint64
		if m&faceFollows != 0 {
			m &^= faceFollows
			pubText = r.str(4 * presence.MaxTextLen)
			if pubVersion = r.uvarint(); pubVersion == 0 || pubVersion > v {
				return bad()
			}
		}
		if r.err != nil || i >= uint64(len(ids)) || st > byte(presence.Invisible) || m > byte(presence.ManualInvisible) ||
			ss > byte(presence.Nobody) || sl > byte(presence.Nobody) || devs > 1<<16 {
			return bad()
		}
		if !asked[ids[i]] {
			continue
		}
		out.Snapshots = append(out.Snapshots, presence.Snapshot{UserID: ids[i], Known: true,
			Status: presence.Status(st), Manual: presence.Manual(m), Text: text, LastSeen: ls, PubLastSeen: pls,
			Devices: int(devs), Version: v, Settings: presence.Settings{Status: presence.Visibility(ss), LastSeen: presence.Visibility(sl)},
			PubText: pubText, PubVersion: pubVersion})
	}
	if len(r.b) != 0 {
		return bad()
	}
	return lease, nil
}

// reader decodes; the first error sticks and every later read is zero.
type reader struct {
	b   []byte
	err error
}

func (r *reader) byte() byte {
	if r.err != nil || len(r.b) == 0 {
		r.err = errBad
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errBad
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errBad
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) str(max int) string {
	n := r.uvarint()
	if r.err != nil || n > uint64(max) || n > uint64(len(r.b)) {
		r.err = errBad
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

var _ tracker.Peers = (*Peers)(nil)

package connbudget

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// connKey is the context key of a request's connection (ConnContext).
type connKey struct{}

// ConnContext is the http.Server's ConnContext hook: it lets Handler find
// the connection of a request.
func (l *Listener) ConnContext(ctx context.Context, nc net.Conn) context.Context {
	if c := l.own(nc); c != nil {
		return context.WithValue(ctx, connKey{}, c)
	}
	return ctx
}

// Handler wraps h, the handler of an http.Server on l (whose ConnState and
// ConnContext are l's), for the requests with a body:
//
//   - While a handler waits for the body, the connection is pending: if it
//     stalls, it gives way to a new connection like one that stalls in
//     its head.
//   - Until the body is read to its end, the answer carries Connection:
//     close. So an answer given before the body was read (401, 403, 404,
//     405, 413, 429, …) is written at once — net/http would otherwise
//     first read what is left of the body, for as long as its client
//     takes — and the connection is closed after it without reading the
//     rest (lingering: the client reads the answer, not a reset).
//   - A request whose body comes in chunks (Transfer-Encoding) is
//     answered and its connection closed: what follows its last chunk is
//     never read as another request. One that also has a Content-Length
//     (request smuggling) is answered 400 and its connection closed, on
//     plain connections whose head began a read (over TLS, the listener
//     sees no head: such a request is answered by its chunks and its
//     connection closed).
//
// Requests without a body go to h untouched.
func (l *Listener) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody) && r.ProtoAtLeast(1, 1) {
			h.ServeHTTP(w, r)
			return
		}
		c, _ := r.Context().Value(connKey{}).(*Conn)
		if c != nil && c.l != l {
			c = nil
		}
		if c != nil && c.mixed.Load() {
			// Content-Length and Transfer-Encoding: a server in front
			// may have read another length than net/http (which takes
			// the chunks), and a request hidden in the body (RFC 9112
			// §6.1, request smuggling).
			c.linger.Store(true)
			_ = http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0))
			hdr := w.Header()
			hdr.Set("Content-Type", "application/json")
			hdr.Set("Connection", "close")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"code":"bad_request","message":"the request has both Content-Length and Transfer-Encoding: give its length one way"}}`)
			return
		}
		if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		hdr := w.Header()
		hdr["Connection"] = connectionClose
		b := bodies.Get().(*watchedBody)
		*b = watchedBody{ReadCloser: r.Body, l: l, c: c, hdr: hdr, chunked: len(r.TransferEncoding) > 0}
		if c != nil {
			l.move(c, stateBusy, stateBody)
		}
		r.Body = b
		h.ServeHTTP(w, r)
		if !b.done {
			// What is left of the body is not read: net/http would
			// wait for it after the answer, to read past it.
			if c != nil {
				c.linger.Store(true)
			}
			_ = http.NewResponseController(w).SetReadDeadline(time.Unix(1, 0))
		}
		if c != nil {
			l.move(c, stateBody, stateBusy)
		}
		*b = watchedBody{}
		bodies.Put(b)
	})
}

// connectionClose is the value of the Connection header Handler sets
// (shared: nothing writes into a header's values).
var connectionClose = []string{"close"}

// watchedBody is a request's body that tells its end.
type watchedBody struct {
	io.ReadCloser
	l       *Listener
	c       *Conn // nil: not one of l's
	hdr     http.Header
	chunked bool
	done    bool // read to its end
}

var bodies = sync.Pool{New: func() any { return new(watchedBody) }}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		if v := b.hdr["Connection"]; !b.chunked && len(v) == 1 && &v[0] == &connectionClose[0] {
			delete(b.hdr, "Connection")
		}
		if b.c != nil {
			b.l.move(b.c, stateBody, stateBusy)
		}
	}
	return n, err
}

// move moves c from state from to state to; in any other state it stays.
func (l *Listener) move(c *Conn, from, to state) {
	l.mu.Lock()
	if c.st == from {
		l.setLocked(c, to)
	}
	l.mu.Unlock()
}

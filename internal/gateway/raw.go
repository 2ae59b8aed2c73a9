package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"

	"github.com/presenced/presenced/internal/apierr"
)

// Accept serves a WebSocket upgrade request that was read off conn
// without net/http (package wsaccept): the same checks, answers and
// upgrade as ServeHTTP, but no net/http connection, reader, writer or
// response is made for it. br holds what the client sent after the
// request's head; it is not used after Accept returns. Accept owns conn.
// It reports whether the upgrade took the connection (hijacked, as
// net/http would tell its ConnState hook); if not, the refusal was
// written and conn closed.
func (g *Gateway) Accept(conn net.Conn, br *bufio.Reader, r *http.Request) bool {
	w := &rawWriter{conn: conn, out: conn, br: br}
	if err := g.upgrade(w, r); err != nil {
		writeHTTPError(w, err)
	}
	if w.bw != nil {
		w.bw.Reset(nil)
		writers.Put(w.bw)
	}
	if !w.hijacked {
		w.finish()
		_ = conn.Close()
	}
	return w.hijacked
}

// RefuseHead writes to out the answer to a request whose head could not
// be read (wsaccept): the API's JSON error with status and code, and
// "Connection: close".
func RefuseHead(out io.Writer, status int, code, message string) {
	w := &rawWriter{out: out}
	apierr.Write(w, apierr.New(status, code, "%s", message))
	w.finish()
}

// writers are the small buffers the 101 answer of an upgrade is written
// through.
var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 512) }}

// rawWriter is the http.ResponseWriter of a request read by wsaccept: a
// refusal is buffered and written, with a Content-Length and
// "Connection: close", when the gateway is done; an upgrade hijacks it.
type rawWriter struct {
	conn     net.Conn
	out      io.Writer
	br       *bufio.Reader
	bw       *bufio.Writer
	header   http.Header
	status   int
	body     bytes.Buffer
	hijacked bool
}

func (w *rawWriter) Header() http.Header {
	if w.header == nil {
		w.header = make(http.Header)
	}
	return w.header
}

func (w *rawWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
}

func (w *rawWriter) Write(b []byte) (int, error) {
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}

// Hijack implements http.Hijacker for the upgrader.
func (w *rawWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	w.hijacked = true
	w.bw = writers.Get().(*bufio.Writer)
	w.bw.Reset(w.conn)
	return w.conn, bufio.NewReadWriter(w.br, w.bw), nil
}

// finish writes the buffered answer.
func (w *rawWriter) finish() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "HTTP/1.1 %d %s\r\n", w.status, http.StatusText(w.status))
	h := w.Header()
	h.Set("Content-Length", strconv.Itoa(w.body.Len()))
	h.Set("Connection", "close")
	_ = h.Write(&b)
	b.WriteString("\r\n")
	b.Write(w.body.Bytes())
	_, _ = w.out.Write(b.Bytes())
}

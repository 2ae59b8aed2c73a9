package connbudget

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
)

// smuggling is a request with both lengths, hiding another request in the
// body its Content-Length tells (a server in front that reads that length
// sees one request; one that reads the chunks, two).
const smuggling = "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 37\r\ntransfer-ENCODING: chunked\r\n\r\n" +
	"0\r\n\r\nGET /ok HTTP/1.1\r\nHost: x\r\n\r\n"

func TestHeadScan(t *testing.T) {
	for _, tc := range []struct {
		head string
		want bool
	}{
		{smuggling, true},
		{"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n", false},
		{"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", false},
		{"POST / HTTP/1.1\nTRANSFER-ENCODING:chunked\nCONTENT-LENGTH:5\n\n", true},
		{"\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", true}, // empty lines before it
		// Not at the start of a line, or after the head: not the fields.
		{"POST / HTTP/1.1\r\nX-Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", false},
		{"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nTransfer-Encoding: chunked\r\n\r\n", false},
		{"POST / HTTP/1.1\r\nContent-Length 5\r\nTransfer-Encoding: chunked\r\n\r\n", false},
	} {
		// Whole, and in two pieces split anywhere.
		for i := 0; i <= len(tc.head); i++ {
			var h headScan
			h.feed([]byte(tc.head[:i]))
			if got := h.feed([]byte(tc.head[i:])); got != tc.want {
				t.Errorf("%q split at %d: %v, want %v", tc.head, i, got, tc.want)
				break
			}
		}
	}
}

// FuzzHeadScan: a head read in pieces gives what it gives read whole.
func FuzzHeadScan(f *testing.F) {
	f.Add([]byte(smuggling), uint16(40))
	f.Add([]byte("GET / HTTP/1.1\r\nContent-Length: 1\r\n\r\n"), uint16(3))
	f.Fuzz(func(t *testing.T, b []byte, at uint16) {
		i := int(at) % (len(b) + 1)
		var whole, pieces headScan
		w := whole.feed(b)
		pieces.feed(b[:i])
		if p := pieces.feed(b[i:]); p != w || pieces.done != whole.done {
			t.Fatalf("%q: whole %v (done %v), split at %d %v (done %v)", b, w, whole.done, i, p, pieces.done)
		}
	})
}

// TestSmugglingRefused: a request with both Content-Length and
// Transfer-Encoding is answered 400 and its connection closed, so the
// request hidden in its body is never answered — on a new connection and
// on one kept alive after a request.
func TestSmugglingRefused(t *testing.T) {
	_, addr := serve(t, Config{Max: 10})
	for _, first := range []bool{true, false} {
		c := dialFrom(t, "127.0.0.1", addr)
		br := bufio.NewReader(c)
		if !first {
			io.WriteString(c, "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
			if resp, body := readResponse(t, c, br); resp.StatusCode != 200 || body != "ok" {
				t.Fatalf("first request: %d %q", resp.StatusCode, body)
			}
		}
		io.WriteString(c, smuggling)
		resp, body := readResponse(t, c, br)
		if code, msg := jsonError(t, body); resp.StatusCode != http.StatusBadRequest || code != "bad_request" || !resp.Close || !strings.Contains(msg, "Content-Length and Transfer-Encoding") {
			t.Fatalf("first request %v: %d %s, close %v: want 400 bad_request closing the connection", first, resp.StatusCode, body, resp.Close)
		}
		awaitClosed(t, "after the 400 (the hidden request unanswered)", c, br)
	}
}

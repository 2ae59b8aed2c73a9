package connbudget

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// jsonResponse is a complete HTTP/1.1 answer that closes the connection,
// with the body every error of the service has: {"error":{code,message}}.
// extra are more header lines, each ending in CRLF.
func jsonResponse(status int, code, message string, extra ...string) []byte {
	body, _ := json.Marshal(struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{Error: struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}{code, message}})
	return fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n%s",
		status, http.StatusText(status), len(body), strings.Join(extra, ""), body)
}

// cannedHeaders follow the status line of the plain-text answers net/http
// writes itself to a request it cannot read (no handler writes them: a
// handler's answer has a Date header, and headers are written sorted).
const cannedHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

// plainToTLS is net/http's answer to a plain HTTP request on a TLS port,
// written on the connection under the TLS one.
const plainToTLS = "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"

// rewrite turns such an answer, written in one call, into JSON; ok is
// false for anything else.
func rewrite(b []byte, maxHeaderBytes int) (out []byte, ok bool) {
	if string(b) == plainToTLS {
		return jsonResponse(http.StatusBadRequest, "https_required",
			"this port serves HTTPS: use https:// (and wss:// for the WebSocket)"), true
	}
	if !bytes.HasPrefix(b, []byte("HTTP/1.1 ")) {
		return nil, false
	}
	end := bytes.Index(b, []byte("\r\n"))
	if end < 12 || !bytes.HasPrefix(b[end:], []byte(cannedHeaders)) {
		return nil, false
	}
	line := string(b[len("HTTP/1.1 "):end]) // "431 Request Header Fields Too Large", "400 Bad Request: missing required Host header"
	status, err := strconv.Atoi(line[:3])
	if err != nil || status < 400 || status > 599 {
		return nil, false
	}
	detail := ""
	if i := bytes.Index([]byte(line), []byte(": ")); i >= 0 {
		detail = line[i+2:]
	}
	var code, message string
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		code = "headers_too_large"
		message = "the request line and headers are over the limit"
		if maxHeaderBytes > 0 {
			message = fmt.Sprintf("the request line and headers are over the limit of %d bytes (read many ids with POST /v1/presence/batch)", maxHeaderBytes)
		}
	case http.StatusHTTPVersionNotSupported:
		code, message = "http_version_not_supported", "only HTTP/1.x is served"
	case http.StatusNotImplemented:
		code, message = "not_implemented", "unsupported transfer encoding"
	default:
		code, message = "bad_request", "the request could not be read as HTTP/1.1"
	}
	if detail != "" && status != http.StatusRequestHeaderFieldsTooLarge {
		message += ": " + detail
	}
	return jsonResponse(status, code, message), true
}

// headScan finds the fields Content-Length and Transfer-Encoding in a
// request head read in pieces (net/http removes both from the request it
// hands on once it has chosen between them). It matches a field's name at
// the start of a line, in any case, up to the head's empty line; what
// follows it (the body) is not looked at. Its zero value is at the start
// of a head.
type headScan struct {
	line  [len(teField)]byte // the current line's first bytes, lower case
	n     int                // bytes of the current line (from len(line) on, no more are kept)
	found uint8              // the fields seen: 1 Content-Length, 2 Transfer-Encoding
	begun bool               // a byte of the request line was read (empty lines before it are skipped, as net/http may)
	done  bool               // the head's empty line was read
}

const (
	clField = "content-length:"
	teField = "transfer-encoding:"
)

// feed scans b and reports whether the head has both fields so far.
func (h *headScan) feed(b []byte) bool {
	for _, ch := range b {
		if h.done {
			break
		}
		switch ch {
		case '\n':
			h.done = h.n == 0 && h.begun
			h.n = 0
			continue
		case '\r':
			continue
		}
		h.begun = true
		if h.n < len(h.line) {
			if 'A' <= ch && ch <= 'Z' {
				ch += 'a' - 'A'
			}
			h.line[h.n] = ch
		}
		h.n++
		switch h.n {
		case len(clField):
			if string(h.line[:h.n]) == clField {
				h.found |= 1
			}
		case len(teField):
			if string(h.line[:h.n]) == teField {
				h.found |= 2
			}
		}
	}
	return h.found == 3
}

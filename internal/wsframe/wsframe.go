// Package wsframe reads one WebSocket frame whole, for the code that
// speaks the protocol frame by frame from the client's side: the load
// tool (cmd/presence-bench) and the tests of the gateway and the node.
// It does what gobwas/ws's deprecated ReadFrame did, the way gobwas/ws
// recommends instead: the header first (ws.ReadHeader), its declared
// length checked against a limit, then the payload read. Read is safe
// for concurrent use on distinct readers.
package wsframe

import (
	"errors"
	"fmt"
	"io"

	"github.com/gobwas/ws"
)

// MaxPayload bounds the payload of a frame Read accepts, far above any
// message of the server (a snapshot of 500 users is ~80 KiB).
const MaxPayload = 4 << 20

// ErrTooLarge is returned by Read for a frame whose header declares a
// payload longer than MaxPayload; nothing of the payload was read.
var ErrTooLarge = errors.New("wsframe: frame payload too large")

// Read reads the next frame from r: its header, then its payload. The
// payload is not unmasked (a server's frames are not masked).
func Read(r io.Reader) (ws.Frame, error) {
	h, err := ws.ReadHeader(r)
	if err != nil {
		return ws.Frame{}, err
	}
	f := ws.Frame{Header: h}
	if h.Length > MaxPayload {
		return f, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, h.Length, MaxPayload)
	}
	if h.Length > 0 {
		f.Payload = make([]byte, h.Length)
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			return f, err
		}
	}
	return f, nil
}

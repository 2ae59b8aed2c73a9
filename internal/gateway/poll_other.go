//go:build !linux

package gateway

import (
	"errors"
	"net"
	"time"
)

// poller hands readable connections to workers; only Linux has one.
type poller interface {
	start()
	stop()
	add(c *conn) error
	remove(c *conn)
}

func newPoller(*Gateway) (poller, error) { return nil, errors.New("epoll is Linux only") }

// unread is Linux only: elsewhere a backlog is not told from silence.
func unread(*conn) bool { return false }

// Elsewhere no connection is detached (hasFD is never set): these are
// never called.
func (c *conn) detach(net.Conn)                          {}
func (c *conn) sockWrite([]byte, time.Time) (int, error) { return 0, net.ErrClosed }
func (c *conn) sockLinger()                              {}
func (c *conn) sockClose()                               {}

//go:build !linux

package gateway

import "errors"

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

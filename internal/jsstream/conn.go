package jsstream

import (
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Conn is a node's one connection to NATS and its one JetStream handle,
// shared by the bus and the ingest consumer. The connection retries for
// ever after a loss and buffers nothing while disconnected (the bus keeps
// its own bounded queue). Who shares it registers what it must hear of
// (OnReconnect, OnAsyncError) before it subscribes; the owner — the one
// who dialled — closes it after every user is closed. Safe for concurrent
// use.
type Conn struct {
	NC *nats.Conn
	JS jetstream.JetStream

	log *slog.Logger

	mu          sync.Mutex // guards the handlers
	onReconnect []func()
	onAsyncErr  []func(*nats.Subscription, error)
}

// Timeouts of Dial.
const (
	connectTimeout = 5 * time.Second
	closeFlushWait = 2 * time.Second
)

// reconnectDelay is the wait before reconnection attempt n: exponential
// from 100 ms, at most 2 s, with a little jitter.
func reconnectDelay(attempts int) time.Duration {
	const maxBackoff = 2 * time.Second
	d := 100 * time.Millisecond
	for i := 1; i < attempts && d < maxBackoff; i++ {
		d *= 2
	}
	d = min(d, maxBackoff)
	return d + mrand.N(d/4+1)
}

// Dial connects to the NATS server(s) at url as name, with the JetStream
// options of its users (the bus's asynchronous publishing bounds).
func Dial(url, name string, log *slog.Logger, jsOpts ...jetstream.JetStreamOpt) (*Conn, error) {
	if log == nil {
		log = slog.Default()
	}
	c := &Conn{log: log}
	nc, err := nats.Connect(url,
		nats.Name(name),
		nats.Timeout(connectTimeout),
		nats.RetryOnFailedConnect(false),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(reconnectDelay),
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				c.log.Warn("disconnected from NATS", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			c.log.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted())
			c.mu.Lock()
			hs := c.onReconnect
			c.mu.Unlock()
			for _, h := range hs {
				h()
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			c.mu.Lock()
			hs := c.onAsyncErr
			c.mu.Unlock()
			if len(hs) == 0 {
				c.log.Warn("NATS error", "err", err)
			}
			for _, h := range hs {
				h(sub, err)
			}
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", RedactURL(url), err)
	}
	js, err := jetstream.New(nc, jsOpts...)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	c.NC, c.JS = nc, js
	return c, nil
}

// OnReconnect registers h to be called (from a goroutine of the NATS
// client; it must not block) each time the connection came back.
func (c *Conn) OnReconnect(h func()) {
	c.mu.Lock()
	c.onReconnect = append(c.onReconnect, h)
	c.mu.Unlock()
}

// OnAsyncError registers h to hear of asynchronous errors (a slow
// consumer, a permission refused); it must not block.
func (c *Conn) OnAsyncError(h func(*nats.Subscription, error)) {
	c.mu.Lock()
	c.onAsyncErr = append(c.onAsyncErr, h)
	c.mu.Unlock()
}

// Close sends what is buffered (bounded by a short wait) and closes the
// connection. It is idempotent.
func (c *Conn) Close() {
	if err := c.NC.FlushTimeout(closeFlushWait); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		c.log.Warn("flush at close failed", "err", err)
	}
	c.NC.Close()
}

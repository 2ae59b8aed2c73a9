package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// redisTarget is a Redis server on a loopback address.
type redisTarget struct {
	addr     string // 127.x.y.z:port
	user     string
	password string
	db       int
}

// parseRedisURL reads redis://[user:password@]host[:port][/db] (or a bare
// host:port) and refuses any host that is not an IPv4 loopback address.
func parseRedisURL(raw string) (redisTarget, error) {
	var t redisTarget
	if !strings.Contains(raw, "://") {
		raw = "redis://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return t, fmt.Errorf("redis %q: %v", raw, err)
	}
	if u.Scheme != "redis" {
		return t, fmt.Errorf("redis %q: want redis://127.0.0.1:6379/0 (no TLS: loopback only)", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return t, fmt.Errorf("redis %q: no query or fragment please", raw)
	}
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "6379"
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return t, fmt.Errorf("redis %q: bad port", raw)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() || ip.To4() == nil {
		return t, fmt.Errorf("redis %q: refusing a server that is not on an IPv4 loopback address", raw)
	}
	t.addr = net.JoinHostPort(ip.String(), port)
	if u.User != nil {
		t.user = u.User.Username()
		t.password, _ = u.User.Password()
	}
	if db := strings.Trim(u.Path, "/"); db != "" {
		if t.db, err = strconv.Atoi(db); err != nil || t.db < 0 {
			return t, fmt.Errorf("redis %q: bad database number %q", raw, db)
		}
	}
	return t, nil
}

// respConn is a plain Redis connection that speaks just enough RESP for the
// baseline: one command, one reply, no pipelining unless the caller writes
// several commands before flushing. Not safe for concurrent use.
type respConn struct {
	nc  net.Conn
	br  *bufio.Reader
	bw  *bufio.Writer
	num []byte // scratch for numbers
}

// errRedis is an error reply of the server.
var errRedis = errors.New("redis error reply")

func dialRedis(ctx context.Context, t redisTarget) (*respConn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	nc, err := d.DialContext(ctx, "tcp", t.addr)
	if err != nil {
		return nil, fmt.Errorf("redis %s: %w", t.addr, err)
	}
	c := &respConn{nc: nc, br: bufio.NewReaderSize(nc, 64<<10), bw: bufio.NewWriterSize(nc, 64<<10), num: make([]byte, 0, 24)}
	if t.password != "" {
		if t.user != "" {
			c.cmd("AUTH", t.user, t.password)
		} else {
			c.cmd("AUTH", t.password)
		}
		if err := c.flushOK(); err != nil {
			nc.Close()
			return nil, fmt.Errorf("redis %s: AUTH: %w", t.addr, err)
		}
	}
	if t.db != 0 {
		c.cmd("SELECT", strconv.Itoa(t.db))
		if err := c.flushOK(); err != nil {
			nc.Close()
			return nil, fmt.Errorf("redis %s: SELECT: %w", t.addr, err)
		}
	}
	return c, nil
}

func (c *respConn) Close() error { return c.nc.Close() }

// cmd buffers one command of string arguments.
func (c *respConn) cmd(args ...string) {
	c.header('*', len(args))
	for _, a := range args {
		c.header('$', len(a))
		c.bw.WriteString(a)
		c.bw.WriteString("\r\n")
	}
}

func (c *respConn) header(kind byte, n int) {
	c.num = append(c.num[:0], kind)
	c.num = strconv.AppendInt(c.num, int64(n), 10)
	c.num = append(c.num, '\r', '\n')
	c.bw.Write(c.num)
}

// bulk buffers one bulk string.
func (c *respConn) bulk(b []byte) {
	c.header('$', len(b))
	c.bw.Write(b)
	c.bw.WriteString("\r\n")
}

// setex buffers SETEX key ttl value without allocating.
func (c *respConn) setex(key []byte, ttl int, value []byte) {
	c.bw.WriteString("*4\r\n$5\r\nSETEX\r\n")
	c.bulk(key)
	c.num = strconv.AppendInt(c.num[:0], int64(ttl), 10)
	c.header('$', len(c.num))
	c.num = strconv.AppendInt(c.num[:0], int64(ttl), 10)
	c.num = append(c.num, '\r', '\n')
	c.bw.Write(c.num)
	c.bulk(value)
}

// keysCmd buffers name key… (MGET, UNLINK).
func (c *respConn) keysCmd(name string, keys [][]byte) {
	c.header('*', 1+len(keys))
	c.header('$', len(name))
	c.bw.WriteString(name)
	c.bw.WriteString("\r\n")
	for _, k := range keys {
		c.bulk(k)
	}
}

func (c *respConn) flush() error { return c.bw.Flush() }

func (c *respConn) flushOK() error {
	if err := c.flush(); err != nil {
		return err
	}
	return c.readOK()
}

// line reads one reply line without its CRLF; the slice is valid until the
// next read.
func (c *respConn) line() ([]byte, error) {
	b, err := c.br.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	if len(b) < 3 || b[len(b)-2] != '\r' {
		return nil, fmt.Errorf("redis: bad reply line %q", b)
	}
	return b[:len(b)-2], nil
}

func (c *respConn) replyErr(b []byte) error {
	return fmt.Errorf("%w: %s", errRedis, b[1:])
}

// readOK reads a +OK (or any simple string) reply.
func (c *respConn) readOK() error {
	b, err := c.line()
	if err != nil {
		return err
	}
	switch b[0] {
	case '+':
		return nil
	case '-':
		return c.replyErr(b)
	}
	return fmt.Errorf("redis: want a status reply, got %q", b)
}

// readInt reads an integer reply.
func (c *respConn) readInt() (int64, error) {
	b, err := c.line()
	if err != nil {
		return 0, err
	}
	switch b[0] {
	case ':':
		return strconv.ParseInt(string(b[1:]), 10, 64)
	case '-':
		return 0, c.replyErr(b)
	}
	return 0, fmt.Errorf("redis: want an integer reply, got %q", b)
}

// readBulkArray reads an array of bulk strings and returns how many there
// were and how many were nil; the values are skipped.
func (c *respConn) readBulkArray() (n, nils int, err error) {
	b, err := c.line()
	if err != nil {
		return 0, 0, err
	}
	switch b[0] {
	case '*':
	case '-':
		return 0, 0, c.replyErr(b)
	default:
		return 0, 0, fmt.Errorf("redis: want an array reply, got %q", b)
	}
	if n, err = strconv.Atoi(string(b[1:])); err != nil {
		return 0, 0, fmt.Errorf("redis: bad array length %q", b)
	}
	for range n {
		b, err := c.line()
		if err != nil {
			return 0, 0, err
		}
		if b[0] != '$' {
			return 0, 0, fmt.Errorf("redis: want a bulk string, got %q", b)
		}
		l, err := strconv.Atoi(string(b[1:]))
		if err != nil {
			return 0, 0, fmt.Errorf("redis: bad bulk length %q", b)
		}
		if l < 0 {
			nils++
			continue
		}
		if _, err := c.br.Discard(l + 2); err != nil {
			return 0, 0, err
		}
	}
	return n, nils, nil
}

// unlinkKeys deletes keys in pipelined batches of 1,000; it returns how
// many existed.
func (c *respConn) unlinkKeys(keys [][]byte) (int64, error) {
	var total int64
	for len(keys) > 0 {
		k := keys[:min(len(keys), 1000)]
		keys = keys[len(k):]
		c.keysCmd("UNLINK", k)
		if err := c.flush(); err != nil {
			return total, err
		}
		n, err := c.readInt()
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

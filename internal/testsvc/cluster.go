package testsvc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Cluster is a Redis Cluster of masters on 127.0.0.1, without replicas,
// the 16384 slots split evenly between them.
type Cluster struct {
	Nodes []*Server // each node; Stop, Kill, Pause and Start act on one
	Addrs []string  // the nodes' "127.0.0.1:port"
	// URL names every node: "redis://127.0.0.1:p1?addr=127.0.0.1:p2&addr=…".
	URL string
}

// RedisCluster starts a private Redis Cluster of n masters (n ≥ 1) for tb,
// closed at tb's cleanup, and waits until every node reports
// cluster_state:ok. Nodes keep no data across a restart, but do keep their
// identity and slots (nodes.conf in their directories).
func RedisCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c, err := StartRedisCluster(n)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			for _, s := range c.Nodes {
				tb.Logf("testsvc: last lines of redis cluster node %s:\n%s", s.Addr, s.LogTail(10))
			}
		}
		c.Close()
	})
	return c
}

// StartRedisCluster is RedisCluster without a testing.TB; the caller
// Closes it.
func StartRedisCluster(n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("testsvc: a Redis Cluster of %d nodes", n)
	}
	c := &Cluster{}
	for range n {
		s, err := startRedis(true)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	c.URL = "redis://" + c.Addrs[0]
	for i, a := range c.Addrs[1:] {
		if i == 0 {
			c.URL += "?"
		} else {
			c.URL += "&"
		}
		c.URL += "addr=" + a
	}
	if err := c.form(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// form gives each node its slots, introduces them, and waits for the
// cluster to be ok everywhere.
func (c *Cluster) form() error {
	const slots = 16384
	n := len(c.Nodes)
	for i, s := range c.Nodes {
		args := []string{"CLUSTER", "ADDSLOTS"}
		for slot := i * slots / n; slot < (i+1)*slots/n; slot++ {
			args = append(args, strconv.Itoa(slot))
		}
		if _, err := redisCmd(s.Addr, args...); err != nil {
			return fmt.Errorf("testsvc: redis cluster: %w", err)
		}
	}
	for _, s := range c.Nodes[1:] {
		if _, err := redisCmd(c.Addrs[0], "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(s.Port)); err != nil {
			return fmt.Errorf("testsvc: redis cluster: %w", err)
		}
	}
	return c.WaitOK(StartTimeout)
}

// WaitOK waits until every node reports cluster_state:ok and knows every
// other node, for at most timeout: after a node's restart, say.
func (c *Cluster) WaitOK(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	want := fmt.Sprintf("cluster_known_nodes:%d", len(c.Nodes))
	for _, s := range c.Nodes {
		for {
			info, err := redisCmd(s.Addr, "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, want) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("testsvc: redis cluster node %s not ok after %v: %v %q", s.Addr, timeout, err, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// Close closes every node. It is idempotent.
func (c *Cluster) Close() error {
	var errs []error
	for _, s := range c.Nodes {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// redisCmd sends one command in RESP and returns its reply: the text of a
// simple string, bulk string or integer; an error reply is an error.
func redisCmd(addr string, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("%s: %s", strings.Join(args[:min(len(args), 2)], " "), line[1:])
	case '$':
		size, err := strconv.Atoi(line[1:])
		if err != nil || size < 0 {
			return "", err
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:size]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

package testsvc

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// StartRedis starts a private redis-server on a free 127.0.0.1 port that
// keeps nothing on disk. The caller Closes it.
func StartRedis() (*Server, error) {
	return startRedis(nil)
}

// startRedis starts a redis-server; a Redis Cluster node with these
// options if cluster is not nil (see clusterOptions).
func startRedis(cluster []string) (*Server, error) {
	bin, err := findBinary("redis-server", "redis-server", "/usr/bin", "/usr/local/bin", "/usr/sbin")
	if err != nil {
		return nil, err
	}
	sp := spec{
		kind: "redis",
		args: func(s *Server) []string {
			a := []string{bin, "--port", fmt.Sprint(s.Port), "--bind", "127.0.0.1",
				"--save", "", "--appendonly", "no", "--dir", s.Dir, "--daemonize", "no",
				"--protected-mode", "no", "--logfile", "", "--maxclients", "2000"}
			if cluster != nil {
				a = append(a, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
				a = append(a, cluster...)
			}
			return a
		},
		busPort: cluster != nil,
		ready:   redisReady,
		stopSig: syscall.SIGTERM,
	}
	return startNew(sp, nil, func(s *Server) string { return "redis://" + s.Addr + "/0" })
}

// Redis starts a private redis-server for tb, closed at tb's cleanup. It
// keeps nothing on disk: after Stop or Kill, Start brings it back empty.
func Redis(tb testing.TB) *Server {
	tb.Helper()
	return fromTB(tb, StartRedis)
}

// SharedRedis returns this test binary's shared redis-server, starting it
// on first use. Tests isolate themselves by key prefix (Unique), never
// FLUSHALL, and cannot stop it. The package's TestMain calls Main.
func SharedRedis(tb testing.TB) *Server {
	tb.Helper()
	return getShared(tb, "redis", StartRedis)
}

// redisReady sends PING and wants +PONG.
func redisReady(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

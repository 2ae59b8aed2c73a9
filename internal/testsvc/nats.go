package testsvc

import (
	"bufio"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// StartNATS starts a private nats-server with JetStream on a free
// 127.0.0.1 port, its store in its own directory. The caller Closes it.
func StartNATS() (*Server, error) {
	bin, err := findBinary("nats-server", "nats-server", "/usr/sbin", "/usr/bin", "/usr/local/bin")
	if err != nil {
		return nil, err
	}
	sp := spec{
		kind: "nats",
		args: func(s *Server) []string {
			return []string{bin, "-js", "-a", "127.0.0.1", "-p", fmt.Sprint(s.Port),
				"-sd", filepath.Join(s.Dir, "jetstream"), "-n", "testsvc-" + fmt.Sprint(s.Port)}
		},
		ready:   natsReady,
		stopSig: syscall.SIGINT,
	}
	return startNew(sp, nil, func(s *Server) string { return "nats://" + s.Addr })
}

// NATS starts a private nats-server with JetStream for tb, closed at tb's
// cleanup. Its streams survive Stop/Start and Kill/Start.
func NATS(tb testing.TB) *Server {
	tb.Helper()
	return fromTB(tb, StartNATS)
}

// SharedNATS returns this test binary's shared nats-server, starting it on
// first use. Tests isolate themselves by subject and stream names
// (Unique) and cannot stop it. The package's TestMain calls Main.
func SharedNATS(tb testing.TB) *Server {
	tb.Helper()
	return getShared(tb, "nats", StartNATS)
}

// natsReady reads the server's INFO, sends CONNECT and PING, and wants
// PONG.
func natsReady(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "INFO ") {
		return fmt.Errorf("greeting %q, want INFO", strings.TrimSpace(line))
	}
	if _, err := c.Write([]byte("CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n")); err != nil {
		return err
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		switch l := strings.TrimSpace(line); {
		case l == "PONG":
			return nil
		case strings.HasPrefix(l, "-ERR"):
			return fmt.Errorf("nats: %s", l)
		}
	}
}

package testsvc_test

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testsvc"
)

// echoServer answers every line with itself.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

type line struct {
	c net.Conn
	r *bufio.Reader
}

func dialLine(t *testing.T, addr string) *line {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &line{c, bufio.NewReader(c)}
}

// roundTrip sends s and reads the answer within wait.
func (l *line) roundTrip(s string, wait time.Duration) (string, error) {
	if _, err := l.c.Write([]byte(s + "\n")); err != nil {
		return "", err
	}
	return l.read(wait)
}

func (l *line) read(wait time.Duration) (string, error) {
	_ = l.c.SetReadDeadline(time.Now().Add(wait))
	got, err := l.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return got[:len(got)-1], nil
}

func TestProxyStallCutRestore(t *testing.T) {
	p := testsvc.NewProxy(t, echoServer(t))
	l := dialLine(t, p.Addr)
	if got, err := l.roundTrip("one", 5*time.Second); err != nil || got != "one" {
		t.Fatalf("through the proxy: %q, %v", got, err)
	}

	// A stall holds the bytes back, the connection stays up, and they
	// arrive once it is restored.
	p.Stall()
	if got, err := l.roundTrip("two", 200*time.Millisecond); err == nil {
		t.Fatalf("stalled: got %q, want a timeout", got)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("stalled: %v, want a timeout", err)
	}
	p.Restore()
	if got, err := l.read(5 * time.Second); err != nil || got != "two" {
		t.Fatalf("after the stall: %q, %v; want the held line", got, err)
	}

	// A cut resets the connection and refuses new ones until restored.
	p.Cut()
	if _, err := l.roundTrip("three", 5*time.Second); err == nil {
		t.Fatal("cut: the old connection still answers")
	}
	if c, err := net.DialTimeout("tcp", p.Addr, time.Second); err == nil {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = c.Write([]byte("four\n"))
		if _, err := bufio.NewReader(c).ReadString('\n'); err == nil {
			t.Fatal("cut: a new connection answers")
		}
		c.Close()
	}
	p.Restore()
	l2 := dialLine(t, p.Addr)
	if got, err := l2.roundTrip("five", 5*time.Second); err != nil || got != "five" {
		t.Fatalf("restored: %q, %v", got, err)
	}
}

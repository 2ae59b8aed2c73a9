//go:build unix

package connbudget

import (
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// A connection whose descriptor its handler took (Detach: the WebSocket
// gateway reads an idle socket itself) keeps its place when its Conn is
// closed, until the handler releases it; a closed Conn detaches nothing.
func TestDetachKeepsThePlace(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := New(ln, Config{Max: 10, PerAddr: 10, Pending: 10})
	defer bl.Close()
	cl := dialFrom(t, "127.0.0.1", ln.Addr().String())
	nc, err := bl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c := nc.(*Conn)
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var dup int
	if err := raw.Control(func(fd uintptr) { dup, err = syscall.Dup(int(fd)) }); err != nil || dup < 0 {
		t.Fatal(err)
	}
	release, ok := c.Detach()
	if !ok {
		t.Fatal("an open connection was not detached")
	}
	if _, ok := c.Detach(); ok {
		t.Fatal("detached twice")
	}
	c.Close()
	if s := bl.Stats(); s.Open != 1 || s.Pending != 0 || s.Idle != 0 {
		t.Fatalf("after Close of the detached Conn: %+v, want 1 open, in no ring", s)
	}
	// The socket lives on through the copy.
	if _, err := syscall.Write(dup, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2)
	cl.SetReadDeadline(time.Now().Add(waitTimeout))
	if _, err := io.ReadFull(cl, buf); err != nil || string(buf) != "hi" {
		t.Fatalf("read %q, %v", buf, err)
	}
	syscall.Close(dup)
	release()
	if s := bl.Stats(); s.Open != 0 {
		t.Fatalf("after release: %+v, want none open", s)
	}
	bl.mu.Lock()
	n := len(bl.addrs)
	bl.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d addresses still held", n)
	}

	dialFrom(t, "127.0.0.1", ln.Addr().String())
	nc, err = bl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if _, ok := nc.(*Conn).Detach(); ok {
		t.Fatal("a closed connection was detached")
	}
	if s := bl.Stats(); s.Open != 0 {
		t.Fatalf("%+v, want none open", s)
	}
}

package testsvc_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/presenced/presenced/internal/testsvc"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// redisPing sends PING over a raw connection and returns the answer.
func redisPing(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// redisDo sends one inline command and returns the first reply line.
func redisDo(t *testing.T, addr, cmd string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(line)
}

// natsPing does the INFO / CONNECT / PING / PONG handshake.
func natsPing(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	r := bufio.NewReader(c)
	info, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(info, "INFO ") || !strings.Contains(info, `"jetstream":true`) {
		return &protoErr{"INFO with jetstream", info}
	}
	if _, err := c.Write([]byte("CONNECT {\"verbose\":false}\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "PONG" {
		return &protoErr{"PONG", line}
	}
	return nil
}

type protoErr struct{ want, got string }

func (e *protoErr) Error() string { return "got " + strings.TrimSpace(e.got) + ", want " + e.want }

func pgSelect1(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	var one int
	if err := c.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		return err
	}
	if one != 1 {
		return &protoErr{"1", string(rune('0' + one))}
	}
	return nil
}

func pgExec(t *testing.T, url, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestRedis(t *testing.T) {
	t.Parallel()
	s := testsvc.Redis(t)
	if !strings.HasPrefix(s.Addr, "127.0.0.1:") || s.URL != "redis://"+s.Addr+"/0" {
		t.Fatalf("Addr %q URL %q", s.Addr, s.URL)
	}
	if got, err := redisPing(s.Addr); err != nil || got != "+PONG" {
		t.Fatalf("PING: %q, %v", got, err)
	}
	if got := redisDo(t, s.Addr, "SET k v"); got != "+OK" {
		t.Fatalf("SET: %q", got)
	}

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if s.Running() {
		t.Fatal("Running after Stop")
	}
	if _, err := redisPing(s.Addr); err == nil {
		t.Fatal("PING answered after Stop")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if got, err := redisPing(s.Addr); err != nil || got != "+PONG" {
		t.Fatalf("PING after restart: %q, %v", got, err)
	}
	if got := redisDo(t, s.Addr, "EXISTS k"); got != ":0" {
		t.Fatalf("EXISTS k after restart = %q, want :0 (no persistence)", got)
	}

	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := redisPing(s.Addr); err == nil {
		t.Fatal("PING answered after Kill")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if got, err := redisPing(s.Addr); err != nil || got != "+PONG" {
		t.Fatalf("PING after Kill and Start: %q, %v", got, err)
	}
	if err := s.Start(); err == nil {
		t.Fatal("Start of a running server: no error")
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := testsvc.Redis(t)
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	// A paused server takes the bytes (the kernel does) but answers none.
	c.SetDeadline(time.Now().Add(200 * time.Millisecond))
	c.Write([]byte("PING\r\n"))
	if line, err := r.ReadString('\n'); err == nil {
		t.Fatalf("paused server answered %q", line)
	} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("read from a paused server: %v, want a timeout", err)
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != "+PONG" {
		t.Fatalf("after Resume: %q, %v", line, err)
	}

	// Stop works on a paused server, and Start brings it back.
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(); err == nil {
		t.Fatal("Pause of a stopped server: no error")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if got, err := redisPing(s.Addr); err != nil || got != "+PONG" {
		t.Fatalf("PING after Start: %q, %v", got, err)
	}
}

func TestNATS(t *testing.T) {
	t.Parallel()
	s := testsvc.NATS(t)
	if s.URL != "nats://"+s.Addr {
		t.Fatalf("URL %q", s.URL)
	}
	if err := natsPing(s.Addr); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := natsPing(s.Addr); err == nil {
		t.Fatal("PING answered after Stop")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := natsPing(s.Addr); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := natsPing(s.Addr); err == nil {
		t.Fatal("PING answered after Kill")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := natsPing(s.Addr); err != nil {
		t.Fatalf("after Kill and Start: %v", err)
	}
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	s := testsvc.Postgres(t)
	if s.URL != "postgres://postgres@"+s.Addr+"/postgres?sslmode=disable" {
		t.Fatalf("URL %q", s.URL)
	}
	if err := pgSelect1(s.URL); err != nil {
		t.Fatal(err)
	}
	db := s.NewDatabase(t)
	pgExec(t, db, "CREATE TABLE kept (n int)")
	pgExec(t, db, "INSERT INTO kept VALUES (1)")

	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := pgSelect1(s.URL); err == nil {
		t.Fatal("SELECT 1 answered after Stop")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	pgExec(t, db, "INSERT INTO kept VALUES (2)")

	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := pgSelect1(s.URL); err == nil {
		t.Fatal("SELECT 1 answered after Kill")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM kept").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Fatalf("rows after Stop/Start and Kill/Start = %d, want 2", n)
	}
}

func TestSharedPostgresDatabasesAreIsolated(t *testing.T) {
	t.Parallel()
	s := testsvc.SharedPostgres(t)
	if s2 := testsvc.SharedPostgres(t); s2 != s {
		t.Fatal("SharedPostgres started a second server")
	}
	if err := s.Stop(); err == nil {
		t.Fatal("Stop of a shared server: no error")
	}
	var wg sync.WaitGroup
	urls := make([]string, 4)
	for i := range urls {
		wg.Go(func() {
			urls[i] = s.NewDatabase(t)
		})
	}
	wg.Wait()
	for i, u := range urls {
		// The same table name in every database: no clash.
		pgExec(t, u, "CREATE TABLE t (n int)")
		pgExec(t, u, "INSERT INTO t VALUES ($1)", i)
	}
	ctx := context.Background()
	for i, u := range urls {
		c, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		rows, _ := c.Query(ctx, "SELECT n FROM t")
		got, err = pgx.CollectRows(rows, pgx.RowTo[int])
		c.Close(ctx)
		if err != nil || len(got) != 1 || got[0] != i {
			t.Errorf("database %d holds %v (%v), want [%d]", i, got, err, i)
		}
	}
}

func TestSharedRedisAndNATS(t *testing.T) {
	t.Parallel()
	r := testsvc.SharedRedis(t)
	if got, err := redisPing(r.Addr); err != nil || got != "+PONG" {
		t.Fatalf("PING: %q, %v", got, err)
	}
	if testsvc.SharedRedis(t) != r {
		t.Fatal("SharedRedis started a second server")
	}
	if err := r.Kill(); err == nil {
		t.Fatal("Kill of a shared server: no error")
	}
	n := testsvc.SharedNATS(t)
	if err := natsPing(n.Addr); err != nil {
		t.Fatal(err)
	}
}

func TestUnique(t *testing.T) {
	a, b := testsvc.Unique(t), testsvc.Unique(t)
	if a == b {
		t.Fatalf("Unique twice: %q", a)
	}
	if strings.Trim(a, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" || len(a) > 63 {
		t.Fatalf("Unique = %q, want [a-z0-9_]{1,63}", a)
	}
}

func TestRedisCluster(t *testing.T) {
	t.Parallel()
	c := testsvc.RedisCluster(t, 3)
	if len(c.Nodes) != 3 || len(c.Addrs) != 3 {
		t.Fatalf("%d nodes, %d addrs, want 3", len(c.Nodes), len(c.Addrs))
	}
	if want := "redis://" + c.Addrs[0] + "?addr=" + c.Addrs[1] + "&addr=" + c.Addrs[2]; c.URL != want {
		t.Fatalf("URL %q, want %q", c.URL, want)
	}
	// Exactly one node owns the key's slot; the others redirect.
	owners := 0
	for _, a := range c.Addrs {
		switch got := redisDo(t, a, "SET {user1}k v"); {
		case got == "+OK":
			owners++
		case strings.HasPrefix(got, "-MOVED "):
		default:
			t.Errorf("SET on %s: %q", a, got)
		}
	}
	if owners != 1 {
		t.Fatalf("%d nodes took the key, want 1", owners)
	}
	// A killed node comes back with its slots.
	if err := c.Nodes[1].Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Nodes[1].Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitOK(10 * time.Second); err != nil {
		t.Fatal(err)
	}
}

// A crashed Go server's tail starts at its panic, not in the middle of
// its stack; otherwise it is the last lines.
func TestLogTailShowsThePanic(t *testing.T) {
	dir := t.TempDir()
	s := &testsvc.Server{Kind: "nats", Dir: dir}
	var log []string
	for i := range 10 {
		log = append(log, fmt.Sprint("line ", i))
	}
	write := func() {
		if err := os.WriteFile(filepath.Join(dir, "nats.log"), []byte(strings.Join(log, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write()
	if got, want := s.LogTail(3), "line 7\nline 8\nline 9"; got != want {
		t.Fatalf("LogTail(3) = %q, want %q", got, want)
	}
	log = append(log, "panic: runtime error: invalid memory address", "", "goroutine 31 [running]:", "frame 1", "frame 2", "frame 3")
	write()
	if got, want := s.LogTail(3), "panic: runtime error: invalid memory address\n\ngoroutine 31 [running]:"; got != want {
		t.Fatalf("LogTail(3) after a panic = %q, want %q", got, want)
	}
}

// Package e2e holds the end-to-end tests of the browser side: a real
// presenced process, the demo page in headless Chromium (Debian's
// /usr/bin/chromium driven by playwright-core from npm), three people, and
// two in the page's room; the unit tests of presence.js under node; and
// the npm package js/presence, packed, type-checked, installed and run
// against a real node.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/auth"
)

// TestBrowser runs e2e/browser.mjs against a fresh presenced started with
// -dev and a 3 s heartbeat ttl; the script can restart the server through
// a control URL to check that pages reconnect, and get short-lived tokens
// from it to check that presence.js renews them. Without node, playwright-core
// or chromium the test fails under CI=true (scripts/test.sh installs them)
// and skips elsewhere.
func TestBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no browser")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	node, chromium := tools(t, root)

	tmp := t.TempDir()
	srv := startServer(t, root, tmp)

	// POST /restart stops presenced gracefully and starts it again on the
	// same address and data; it answers once the new process is healthy.
	// GET /token?user=U&ttl=D mints a client token for U that expires
	// after D, signed with the server's JWT secret: the backend that the
	// browser script asks for a page's fresh tokens.
	control := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/token" {
			tok, err := mint(srv.data, r.URL.Query().Get("user"), r.URL.Query().Get("ttl"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			fmt.Fprintln(w, tok)
			return
		}
		if r.Method != http.MethodPost || r.URL.Path != "/restart" {
			http.NotFound(w, r)
			return
		}
		if err := srv.stop(); err != nil {
			http.Error(w, "stop: "+err.Error(), http.StatusInternalServerError)
			return
		}
		if err := srv.start(srv.address()); err != nil {
			http.Error(w, "start: "+err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "restarted")
	}))
	defer control.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// PRESENCED_E2E_OUT keeps the screenshots somewhere that outlives the test.
	out := os.Getenv("PRESENCED_E2E_OUT")
	if out == "" {
		out = tmp
	}
	cmd := exec.CommandContext(ctx, node, filepath.Join(root, "e2e", "browser.mjs"), "http://"+srv.address(), out, control.URL)
	cmd.Dir = root
	token, err := exec.Command(srv.bin, "-data", srv.data, "-print-token", "dave").Output()
	if err != nil {
		t.Fatalf("presenced -print-token dave: %v", err)
	}
	cmd.Env = append(os.Environ(), "PRESENCED_CHROMIUM="+chromium, "PRESENCED_TTL_MS=3000",
		"PRESENCED_E2E_TOKEN="+strings.TrimSpace(string(token)))
	lines := &lineLogger{t: t, prefix: "browser: "}
	cmd.Stdout, cmd.Stderr = lines, lines
	cmd.WaitDelay = 5 * time.Second
	began := time.Now()
	runErr := cmd.Run()
	lines.Flush()
	t.Logf("browser scenario took %s; screenshot of the watcher's page: %s", time.Since(began).Round(100*time.Millisecond),
		filepath.Join(out, "watcher.png"))
	if runErr != nil {
		t.Errorf("browser scenario failed: %v", runErr)
	}

	if err := srv.stop(); err != nil {
		t.Errorf("presenced did not stop cleanly: %v", err)
	}
	if logs := srv.logs.String(); strings.Contains(logs, "DATA RACE") || strings.Contains(logs, "panic") {
		t.Errorf("presenced reported a data race or a panic")
	}
}

// mint signs a client token for user, valid for ttl (a Go duration), with
// the JWT secret presenced generated into its data directory.
func mint(data, user, ttl string) (string, error) {
	life, err := time.ParseDuration(ttl)
	if err != nil {
		return "", fmt.Errorf("ttl: %w", err)
	}
	secret, err := os.ReadFile(filepath.Join(data, "jwt-secret"))
	if err != nil {
		return "", err
	}
	return auth.Token{User: user}.Sign(bytes.TrimSpace(secret), time.Now(), life)
}

// tools finds node, playwright-core and chromium, or ends the test.
func tools(t *testing.T, root string) (node, chromium string) {
	t.Helper()
	var missing []string
	node, err := exec.LookPath("node")
	if err != nil {
		missing = append(missing, "node (Debian: apt-get install nodejs)")
	}
	if _, err := os.Stat(filepath.Join(root, "node_modules", "playwright-core", "package.json")); err != nil {
		missing = append(missing, "playwright-core (npm ci in the repository root)")
	}
	chromium = os.Getenv("PRESENCED_CHROMIUM")
	if chromium == "" {
		chromium = "/usr/bin/chromium"
	}
	if _, err := os.Stat(chromium); err != nil {
		missing = append(missing, chromium+" (Debian: apt-get install chromium)")
	}
	if len(missing) == 0 {
		return node, chromium
	}
	msg := "the browser test needs " + strings.Join(missing, ", ") + "; ./scripts/test.sh installs them"
	if os.Getenv("CI") == "true" && !testing.Short() {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return "", ""
}

// startServer builds presenced into dir, starts it on a free loopback
// port with its data under dir and args added to its flags, stops it when
// the test ends and shows its log if the test failed.
func startServer(t *testing.T, root, dir string, args ...string) *server {
	t.Helper()
	srv := &server{bin: filepath.Join(dir, "presenced"), data: filepath.Join(dir, "data"), args: args}
	build(t, root, srv.bin)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("presenced log:\n%s", srv.logs.String())
		}
	})
	if err := srv.start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.stop() })
	return srv
}

// build compiles cmd/presenced into bin, with -race when the test runs
// under -race, so the browser's traffic is checked for data races too.
func build(t *testing.T, root, bin string) {
	t.Helper()
	// go test puts the go command's own GOROOT/bin first on the PATH of
	// the tests it runs.
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go build: %v", err)
	}
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command(goBin, append(args, "./cmd/presenced")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
}

var listening = regexp.MustCompile(`presenced listening"? addr=(\S+)`)

// server is one presenced process at a time, started and stopped by the
// test goroutine and the control handler (never both at once: the browser
// script waits for each restart).
type server struct {
	bin, data string
	args      []string   // flags beyond those of every test
	logs      syncBuffer // every run's log, for a failure report

	mu   sync.Mutex // guards the fields below
	addr string
	cmd  *exec.Cmd
	done chan error // the exit of cmd, once its log is read
}

// start runs presenced on addr and waits until it is healthy.
func (s *server) start(addr string) error {
	args := append([]string{"-dev", "-addr", addr, "-heartbeat-ttl", "3s", "-data", s.data, "-log-level", "info"}, s.args...)
	cmd := exec.Command(s.bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start presenced: %w", err)
	}
	found := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			s.logs.WriteLine(line)
			if m := listening.FindStringSubmatch(line); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		done <- cmd.Wait() // after the last line: Wait closes the pipe
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	var base string
	select {
	case a := <-found:
		base = "http://" + a
		s.mu.Lock()
		s.addr = a
		s.mu.Unlock()
	case err := <-done:
		done <- err
		return fmt.Errorf("presenced exited before listening: %v", err)
	case <-time.After(30 * time.Second):
		return errors.New("presenced did not say where it listens within 30s")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("presenced at %s not healthy within 10s (last error %v)", base, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *server) address() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// stop sends SIGINT and waits for a clean exit; it is a no-op when nothing
// runs.
func (s *server) stop() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-done:
		return err
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		return errors.Join(errors.New("no exit 15s after SIGINT"), <-done)
	}
}

// syncBuffer collects log lines; safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) WriteLine(line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.WriteString(line)
	s.b.WriteByte('\n')
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lineLogger writes a child's output to the test log line by line.
type lineLogger struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex // guards buf
	buf    []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.t.Log(l.prefix + string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

func (l *lineLogger) Flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.t.Log(l.prefix + string(l.buf))
		l.buf = nil
	}
}

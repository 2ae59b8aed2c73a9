package main

// Process-level tests of the presenced binary: it is built once, started on
// a free loopback port against a temporary data directory, and driven over
// HTTP and with signals. The quick flag and environment cases call run
// in-process instead.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gobwas/ws"
	"github.com/golang-jwt/jwt/v5"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/testsvc"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/wsframe"
)

const (
	apiKey = "presenced-test-api-key-of-32-bytes"
	// testSecret is the JWT secret of tests that sign their own tokens.
	testSecret  = "presenced-test-jwt-secret-of-32-bytes"
	waitTimeout = 15 * time.Second // generous: -race and loaded CI machines
)

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binary builds the presenced binary once per test run and returns its path.
func binary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "presenced-test-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "presenced")
		out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// syncBuffer is a process's output, read while it writes.
type syncBuffer = testsvc.Output

// cleanEnv is the test's environment without any PRESENCE_ variable, so
// that the developer's shell cannot change what the tests see.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// baseArgs are the flags of a test server on data directory dir.
func baseArgs(dir string, more ...string) []string {
	return append([]string{"-addr", "127.0.0.1:0", "-data", dir}, more...)
}

// --- a server under test, in a process or in-process ---

type server struct {
	t    *testing.T
	base string // http://127.0.0.1:port
	logs *syncBuffer
}

var listeningRE = regexp.MustCompile(`msg="presenced listening" addr=(\S+)`)

// awaitReady waits for the listening line in logs, then for /readyz to
// answer 200. exited is closed when the server stopped on its own.
func awaitReady(t *testing.T, logs *syncBuffer, exited <-chan struct{}) *server {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	var addr string
	for addr == "" {
		if m := listeningRE.FindStringSubmatch(logs.String()); m != nil {
			addr = m[1]
			break
		}
		select {
		case <-exited:
			t.Fatalf("presenced exited before listening; logs:\n%s", logs)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("presenced did not log its address within %s; logs:\n%s", waitTimeout, logs)
		}
	}
	s := &server{t: t, base: "http://" + addr, logs: logs}
	for {
		resp, err := http.Get(s.base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case <-exited:
			t.Fatalf("presenced exited before ready; logs:\n%s", logs)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("presenced not ready within %s (last error %v); logs:\n%s", waitTimeout, err, logs)
		}
	}
}

var client = &http.Client{Timeout: 10 * time.Second}

// do sends a request with the bearer credential cred (none if empty) and a
// JSON body (none if nil), and returns the status code and the body.
func (s *server) do(method, path, cred string, body any) (int, []byte) {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			s.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return resp.StatusCode, b
}

// call is do that insists on 200 and decodes a JSON object.
func (s *server) call(method, path, cred string, body any) map[string]any {
	s.t.Helper()
	code, b := s.do(method, path, cred, body)
	if code != http.StatusOK {
		s.t.Fatalf("%s %s: got %d %s, want 200", method, path, code, b)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		s.t.Fatalf("%s %s: %v in %s", method, path, err, b)
	}
	return m
}

func (s *server) heartbeat(cred, user, device string) map[string]any {
	s.t.Helper()
	body := map[string]any{"device_id": device}
	if user != "" {
		body["user_id"] = user
	}
	return s.call("POST", "/v1/heartbeat", cred, body)
}

// checkpoints reads presenced_last_seen_checkpoints_total from /metrics,
// with the API key (the metrics are for its holders).
func (s *server) checkpoints() float64 {
	s.t.Helper()
	return metric(s.t, s, "presenced_last_seen_checkpoints_total")
}

// awaitLog waits until the logs contain every one of subs on one line.
func (s *server) awaitLog(subs ...string) string {
	s.t.Helper()
	var found string
	testwait.Forf(s.t, func() string { return fmt.Sprintf("a log line with %q; logs:\n%s", subs, s.logs) }, func() bool {
		for _, line := range strings.Split(s.logs.String(), "\n") {
			if containsAll(line, subs...) {
				found = line
				return true
			}
		}
		return false
	})
	return found
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// --- the binary as a process ---

type proc struct {
	*server
	cmd    *exec.Cmd
	stdout *syncBuffer
	exited chan struct{} // closed when Wait returned
}

// start runs the binary with env (added to a clean environment) and args
// and waits until it is ready. It is killed when the test ends.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := startNoWait(t, env, args...)
	p.server = awaitReady(t, p.cmd.Stderr.(*syncBuffer), p.exited)
	return p
}

func startNoWait(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startCmd(t, exec.Command(binary(t), args...), env)
}

// startCmd starts cmd (the binary, perhaps through a shell) with env added
// to a clean environment; it is killed when the test ends.
func startCmd(t *testing.T, cmd *exec.Cmd, env []string) *proc {
	t.Helper()
	cmd.Env = cleanEnv(env...)
	p := &proc{cmd: cmd, stdout: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout = p.stdout
	cmd.Stderr = &syncBuffer{}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
			return
		default:
		}
		cmd.Process.Kill()
		<-p.exited
	})
	return p
}

func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
	if sig == syscall.SIGSTOP {
		if err := testsvc.AwaitStopped(p.cmd.Process.Pid, waitTimeout); err != nil {
			t.Fatal(err)
		}
	}
}

// wait waits for the process to exit and returns its exit code (-1 when a
// signal ended it).
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(waitTimeout):
		t.Fatalf("presenced did not exit within %s; logs:\n%s", waitTimeout, p.cmd.Stderr)
	}
	return p.cmd.ProcessState.ExitCode()
}

// stopWith sends sig and insists on a clean exit (code 0, the shutdown
// logged to the end).
func (p *proc) stopWith(t *testing.T, sig os.Signal) {
	t.Helper()
	p.signal(t, sig)
	if code := p.wait(t); code != 0 {
		t.Fatalf("after %v: exit code %d, want 0; logs:\n%s", sig, code, p.logs)
	}
	logs := p.logs.String()
	if !strings.Contains(logs, `msg="presenced stopped"`) {
		t.Errorf("after %v: no \"presenced stopped\" in the logs:\n%s", sig, logs)
	}
	if strings.Contains(logs, "level=ERROR") {
		t.Errorf("after %v: errors logged:\n%s", sig, logs)
	}
}

// runBinary runs the binary to completion and returns its exit code,
// stdout and stderr.
func runBinary(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Env = cleanEnv(env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("presenced %q: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("presenced %q did not exit within %s; stderr:\n%s", args, waitTimeout, stderr.String())
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// --- run in-process ---

// startInProcess calls run with args and the environment env (nothing else)
// and waits until it is ready. It is stopped, and must return nil, when the
// test ends.
func startInProcess(t *testing.T, env map[string]string, args ...string) *server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	errc := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		errc <- run(ctx, args, func(k string) string { return env[k] }, io.Discard, logs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-errc:
			if err != nil {
				t.Errorf("run returned %v after cancel; logs:\n%s", err, logs)
			}
		case <-time.After(waitTimeout):
			t.Errorf("run did not return within %s of cancel", waitTimeout)
		}
	})
	return awaitReady(t, logs, exited)
}

// runQuick calls run for a case that must end by itself, and returns its
// error, stdout and stderr.
func runQuick(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	var out, errOut syncBuffer
	err = run(ctx, args, func(k string) string { return env[k] }, &out, &errOut)
	if ctx.Err() != nil {
		t.Fatalf("run %q did not return by itself", args)
	}
	return out.String(), errOut.String(), err
}

// --- tests ---

// SIGTERM stops the node gracefully: the last checkpoint is written, so a
// heartbeat sent just before is durable although no periodic checkpoint
// has run yet.
func TestSIGTERMFlushesLastSeen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	args := baseArgs(dir, "-api-key", apiKey, "-heartbeat-ttl", "2s")
	p := start(t, nil, args...)

	// Beat until no periodic checkpoint (every 1s) came between the beat
	// and the signal, so that only the shutdown can have saved it.
	var lastSeen any
	for try := 0; ; try++ {
		before := p.checkpoints()
		hb := p.heartbeat(apiKey, "u1", "d1")
		if hb["status"] != "online" {
			t.Fatalf("heartbeat: status %v, want online: %v", hb["status"], hb)
		}
		lastSeen = hb["last_seen"]
		if p.checkpoints() == before {
			break
		}
		if try == 5 {
			t.Log("a periodic checkpoint always came first; the test proves less")
			break
		}
		time.Sleep(5 * time.Millisecond) // a new millisecond, a new last_seen
	}
	if _, ok := lastSeen.(string); !ok {
		t.Fatalf("heartbeat: last_seen %v, want a time", lastSeen)
	}
	p.stopWith(t, syscall.SIGTERM)

	p = start(t, nil, args...)
	got := p.call("GET", "/v1/presence/u1", apiKey, nil)
	if got["last_seen"] != lastSeen || got["status"] != "offline" {
		t.Errorf("after restart: status %v last_seen %v, want offline %v", got["status"], got["last_seen"], lastSeen)
	}
}

// kill -9 loses at most what came after the last periodic checkpoint; a
// manual status is durable before it is acknowledged.
func TestSIGKILLKeepsCheckpointsAndStatus(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	args := baseArgs(dir, "-api-key", apiKey, "-heartbeat-ttl", "2s")
	p := start(t, nil, args...)

	hb := p.heartbeat(apiKey, "u1", "d1")
	lastSeen, _ := hb["last_seen"].(string)
	if lastSeen == "" {
		t.Fatalf("heartbeat: no last_seen: %v", hb)
	}
	testwait.For(t, "a checkpoint", func() bool { return p.checkpoints() >= 1 })
	// u2 changes right before the kill, most likely after the last
	// checkpoint: its versions are lost with the process.
	p.heartbeat(apiKey, "u2", "d1")
	busy := p.call("POST", "/v1/status", apiKey, map[string]any{"user_id": "u2", "status": "busy"})
	before, _ := busy["version"].(float64)
	if before == 0 {
		t.Fatalf("status answer without a version: %v", busy)
	}
	p.signal(t, syscall.SIGKILL)
	if code := p.wait(t); code == 0 {
		t.Fatalf("exit code 0 after SIGKILL")
	}

	p = start(t, nil, args...)
	got := p.call("GET", "/v1/presence/u1", apiKey, nil)
	if got["last_seen"] != lastSeen || got["status"] != "offline" {
		t.Errorf("after kill -9: status %v last_seen %v, want offline %v", got["status"], got["last_seen"], lastSeen)
	}
	// The next run stamps versions above every one of the run that died,
	// checkpointed or not, and below 2^53.
	if after, _ := p.heartbeat(apiKey, "u2", "d1")["version"].(float64); after <= before || after >= 1<<53 {
		t.Errorf("after kill -9: u2's version %v, want above %v (before the kill) and below 2^53", after, before)
	}

	// A synchronous durable write, then kill -9 at once.
	st := p.call("POST", "/v1/status", apiKey, map[string]any{"user_id": "u1", "status": "invisible", "text": "gone fishing"})
	if st["user_id"] != "u1" {
		t.Fatalf("status: %v", st)
	}
	p.signal(t, syscall.SIGKILL)
	p.wait(t)

	p = start(t, nil, args...)
	dbg := p.call("GET", "/v1/debug/users/u1", apiKey, nil)
	if dbg["manual_status"] != "invisible" || dbg["status_text"] != "gone fishing" {
		t.Errorf("after kill -9: manual_status %v status_text %v, want invisible %q", dbg["manual_status"], dbg["status_text"], "gone fishing")
	}
	if dbg["last_seen"] != lastSeen {
		t.Errorf("after kill -9: debug last_seen %v, want %v (the status must not clobber it)", dbg["last_seen"], lastSeen)
	}
	// Everyone else sees the invisible user as offline, last seen frozen.
	pub := p.call("GET", "/v1/presence/u1", apiKey, nil)
	if pub["status"] != "offline" || pub["devices"] != 0.0 || pub["last_seen"] != lastSeen {
		t.Errorf("invisible user reads as %v, want offline, 0 devices, last_seen %v", pub, lastSeen)
	}
}

func TestSIGINTExitsCleanly(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	args := baseArgs(dir, "-api-key", apiKey)
	p := start(t, nil, args...)
	hb := p.heartbeat(apiKey, "u1", "d1")
	p.stopWith(t, syscall.SIGINT)

	// The final checkpoint ran on SIGINT too.
	p = start(t, nil, args...)
	if got := p.call("GET", "/v1/presence/u1", apiKey, nil); got["last_seen"] != hb["last_seen"] {
		t.Errorf("after SIGINT: last_seen %v, want %v", got["last_seen"], hb["last_seen"])
	}
}

func TestEnvironment(t *testing.T) {
	t.Parallel()
	const envKey, flagKey = "presenced-test-key-from-the-environment", "presenced-test-key-from-the-flag-0123"
	env := []string{envName("api-key") + "=" + envKey, envName("heartbeat-ttl") + "=7s"}

	t.Run("binary", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		p := start(t, env, baseArgs(dir)...)
		if hb := p.heartbeat(envKey, "u1", "d1"); hb["ttl_ms"] != 7000.0 {
			t.Errorf("ttl_ms %v, want 7000 from %s", hb["ttl_ms"], env[1])
		}
		if code, b := p.do("POST", "/v1/heartbeat", apiKey, map[string]any{"user_id": "u1", "device_id": "d1"}); code != http.StatusUnauthorized {
			t.Errorf("another key: %d %s, want 401", code, b)
		}
		if _, err := os.Stat(filepath.Join(dir, "api-key")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("api-key file with the key from the environment: stat err %v, want not exist", err)
		}
	})

	t.Run("flags win", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		p := start(t, env, baseArgs(dir, "-api-key", flagKey, "-heartbeat-ttl", "3s")...)
		if hb := p.heartbeat(flagKey, "u1", "d1"); hb["ttl_ms"] != 3000.0 {
			t.Errorf("ttl_ms %v, want 3000 from the flag", hb["ttl_ms"])
		}
		if code, b := p.do("POST", "/v1/heartbeat", envKey, map[string]any{"user_id": "u1", "device_id": "d1"}); code != http.StatusUnauthorized {
			t.Errorf("key from the environment beside a flag: %d %s, want 401", code, b)
		}
	})

	t.Run("in-process", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		env := map[string]string{
			envName("api-key"):       envKey,
			envName("heartbeat-ttl"): "7s",
			envName("idle-after"):    "1m",
			envName("addr"):          "127.0.0.1:1", // the flag wins
			envName("data"):          dir,
		}
		s := startInProcess(t, env, "-addr", "127.0.0.1:0", "-heartbeat-ttl", "4s")
		if hb := s.heartbeat(envKey, "u1", "d1"); hb["ttl_ms"] != 4000.0 {
			t.Errorf("ttl_ms %v, want 4000 from the flag", hb["ttl_ms"])
		}
		dbg := s.call("GET", "/v1/debug/users/u1", envKey, nil)
		rules, _ := dbg["rules"].(map[string]any)
		if rules["idle_after_ms"] != 60000.0 {
			t.Errorf("idle_after_ms %v, want 60000 from %s", rules["idle_after_ms"], envName("idle-after"))
		}
		if _, err := os.Stat(filepath.Join(dir, "presenced.db")); err != nil {
			t.Errorf("%s ignored: %v", envName("data"), err)
		}
	})
}

func TestGeneratedSecrets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	args := baseArgs(dir)
	p := start(t, nil, args...)

	keyFile := filepath.Join(dir, "api-key")
	readSecret := func(path string) string {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatalf("generated secret: %v", err)
		}
		if mode := fi.Mode().Perm(); mode != 0o600 {
			t.Errorf("%s has mode %o, want 600", path, mode)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s := strings.TrimSpace(string(b))
		if len(s) < 32 {
			t.Fatalf("%s holds %q: too short for a secret", path, s)
		}
		return s
	}
	key := readSecret(keyFile)
	jwtSecret := readSecret(filepath.Join(dir, "jwt-secret"))
	if key == jwtSecret {
		t.Errorf("api key and JWT secret are the same")
	}
	p.heartbeat(key, "u1", "d1")
	if code, b := p.do("POST", "/v1/heartbeat", "wrong", map[string]any{"user_id": "u1", "device_id": "d1"}); code != http.StatusUnauthorized {
		t.Errorf("wrong key: %d %s, want 401", code, b)
	}

	// -print-token signs with the secret in the data directory; the
	// running server accepts it as that user.
	code, out, errOut := runBinary(t, nil, "-data", dir, "-print-token", "alice")
	if code != 0 {
		t.Fatalf("-print-token: exit %d: %s", code, errOut)
	}
	token := strings.TrimSpace(out)
	if strings.Count(token, ".") != 2 {
		t.Fatalf("-print-token printed %q, want a JWT", out)
	}
	hb := p.heartbeat(token, "", "phone")
	if hb["user_id"] != "alice" || hb["status"] != "online" {
		t.Errorf("heartbeat with the printed token: %v, want alice online", hb)
	}
	if code, b := p.do("POST", "/v1/heartbeat", token, map[string]any{"user_id": "bob", "device_id": "phone"}); code != http.StatusForbidden {
		t.Errorf("alice's token acting for bob: %d %s, want 403", code, b)
	}
	p.stopWith(t, syscall.SIGTERM)

	// A restart reuses both secrets.
	p = start(t, nil, args...)
	if got := readSecret(keyFile); got != key {
		t.Errorf("restart changed the api key: %q, was %q", got, key)
	}
	p.heartbeat(key, "u1", "d1")
	if hb := p.heartbeat(token, "", "phone"); hb["user_id"] != "alice" {
		t.Errorf("token after restart: %v", hb)
	}
	if strings.Contains(p.logs.String(), "generated a new secret") {
		t.Errorf("restart generated a new secret:\n%s", p.logs)
	}
}

func TestDevMode(t *testing.T) {
	t.Parallel()
	body := map[string]any{"user_id": "bob", "device_id": "d1"}

	t.Run("dev", func(t *testing.T) {
		t.Parallel()
		p := start(t, nil, baseArgs(t.TempDir(), "-dev")...)
		startup := p.logs.String()
		if i := strings.Index(startup, "presenced listening"); !strings.Contains(startup[:i], "INSECURE") || !strings.Contains(startup[:i], "level=WARN") {
			t.Errorf("no INSECURE warning at start:\n%s", startup)
		}
		hb := p.call("POST", "/v1/heartbeat", "", body)
		if hb["user_id"] != "bob" {
			t.Errorf("heartbeat without credentials: %v", hb)
		}
		p.awaitLog("level=WARN", "INSECURE", "/v1/heartbeat", "user_id=bob")
	})

	t.Run("dev from the environment", func(t *testing.T) {
		t.Parallel()
		s := startInProcess(t, map[string]string{envName("dev"): "true", envName("data"): t.TempDir()}, "-addr", "127.0.0.1:0")
		s.awaitLog("level=WARN", "INSECURE DEVELOPMENT MODE")
		if code, b := s.do("POST", "/v1/heartbeat", "", body); code != http.StatusOK {
			t.Errorf("heartbeat without credentials: %d %s", code, b)
		}
		s.awaitLog("level=WARN", "INSECURE", "/v1/heartbeat", "user_id=bob")
	})

	t.Run("not dev", func(t *testing.T) {
		t.Parallel()
		p := start(t, nil, baseArgs(t.TempDir(), "-api-key", apiKey)...)
		for _, path := range []string{"/v1/heartbeat", "/v1/status"} {
			if code, b := p.do("POST", path, "", body); code != http.StatusUnauthorized {
				t.Errorf("POST %s without credentials: %d %s, want 401", path, code, b)
			}
		}
		if code, b := p.do("GET", "/v1/presence/bob", "", nil); code != http.StatusUnauthorized {
			t.Errorf("GET without credentials: %d %s, want 401", code, b)
		}
		if strings.Contains(p.logs.String(), "INSECURE") {
			t.Errorf("INSECURE logged without -dev:\n%s", p.logs)
		}
	})
}

// TestMetricsNeedTheKey: /metrics answers holders of the API key (as
// Prometheus sends it, a bearer token), and anybody only in -dev mode.
func TestMetricsNeedTheKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startInProcess(t, nil, baseArgs(dir, "-api-key", apiKey, "-jwt-secret", testSecret)...)
	if code, b := s.do("GET", "/metrics", "", nil); code != http.StatusUnauthorized {
		t.Errorf("without credentials: %d %s, want 401", code, b)
	}
	if code, b := s.do("GET", "/metrics", "wrong", nil); code != http.StatusUnauthorized {
		t.Errorf("with a wrong key: %d %s, want 401", code, b)
	}
	tok, _, err := runQuick(t, nil, "-data", dir, "-jwt-secret", testSecret, "-print-token", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if code, b := s.do("GET", "/metrics", strings.TrimSpace(tok), nil); code != http.StatusForbidden {
		t.Errorf("with a client token: %d %s, want 403", code, b)
	}
	code, b := s.do("GET", "/metrics", apiKey, nil)
	if code != http.StatusOK || !strings.Contains(string(b), "presenced_heartbeats_total") {
		t.Errorf("with the key: %d %s, want 200 and the metrics", code, b)
	}
	for _, open := range []string{"/healthz", "/readyz"} {
		if code, b := s.do("GET", open, "", nil); code != http.StatusOK {
			t.Errorf("%s without credentials: %d %s, want 200", open, code, b)
		}
	}

	dev := startInProcess(t, nil, baseArgs(t.TempDir(), "-dev")...)
	if code, b := dev.do("GET", "/metrics", "", nil); code != http.StatusOK {
		t.Errorf("-dev without credentials: %d %s, want 200", code, b)
	}
}

// TestMaxDevicesFlag: -max-devices caps the alive devices of a user; one
// more is refused with 409 too_many_devices.
func TestMaxDevicesFlag(t *testing.T) {
	t.Parallel()
	s := startInProcess(t, map[string]string{envName("max-devices"): "5"}, baseArgs(t.TempDir(), "-api-key", apiKey, "-max-devices", "2")...)
	s.heartbeat(apiKey, "u1", "d1")
	s.heartbeat(apiKey, "u1", "d2")
	code, b := s.do("POST", "/v1/heartbeat", apiKey, map[string]any{"user_id": "u1", "device_id": "d3"})
	if code != http.StatusConflict || !strings.Contains(string(b), `"too_many_devices"`) {
		t.Errorf("third device: %d %s, want 409 too_many_devices (the flag beats the environment)", code, b)
	}
	if hb := s.heartbeat(apiKey, "u1", "d1"); hb["devices"] != 2.0 {
		t.Errorf("known device: %v, want 2 devices", hb)
	}
}

// TestMaxSubscriptionsFlag: PRESENCE_MAX_SUBSCRIPTIONS caps the users one
// WebSocket watches.
func TestMaxSubscriptionsFlag(t *testing.T) {
	t.Parallel()
	s := startInProcess(t, map[string]string{envName("max-subscriptions"): "2"},
		baseArgs(t.TempDir(), "-api-key", apiKey, "-jwt-secret", testSecret)...)
	tok, err := auth.Sign([]byte(testSecret), "1", "", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nc, br, _, err := ws.Dialer{Timeout: waitTimeout}.Dial(context.Background(), "ws"+strings.TrimPrefix(s.base, "http")+"/v1/ws?token="+tok)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer nc.Close()
	var r io.Reader = nc
	if br != nil {
		r = br
	}
	read := func() map[string]any {
		t.Helper()
		_ = nc.SetReadDeadline(time.Now().Add(waitTimeout))
		f, err := wsframe.Read(r)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(f.Payload, &m); err != nil {
			t.Fatalf("%q: %v", f.Payload, err)
		}
		return m
	}
	if m := read(); m["type"] != "welcome" {
		t.Fatalf("first message %v", m)
	}
	if err := ws.WriteFrame(nc, ws.MaskFrameInPlace(ws.NewTextFrame([]byte(`{"type":"subscribe","user_ids":["2","3","4"]}`)))); err != nil {
		t.Fatal(err)
	}
	if m := read(); m["type"] != "error" || m["code"] != "too_many_subscriptions" {
		t.Fatalf("subscribe to 3: %v, want too_many_subscriptions", m)
	}
}

// TestDevListensOnLoopback: an insecure node listens on 127.0.0.1:8080
// unless told otherwise.
func TestDevListensOnLoopback(t *testing.T) {
	// Not parallel: it needs the port 8080 of the loopback to itself.
	ln, err := net.Listen("tcp", "127.0.0.1:8080")
	if err != nil {
		// Taken (a node the README told to leave running): a node in
		// -dev mode must then fail to listen on exactly that address.
		for name, env := range map[string]map[string]string{
			"flag":        {envName("data"): t.TempDir()},
			"environment": {envName("dev"): "true", envName("data"): t.TempDir()},
		} {
			args := []string{}
			if name == "flag" {
				args = append(args, "-dev")
			}
			_, _, err := runQuick(t, env, args...)
			if err == nil || !strings.Contains(err.Error(), "127.0.0.1:8080") {
				t.Errorf("%s: -dev without an address, 127.0.0.1:8080 taken: %v, want a failure to listen there", name, err)
			}
		}
		return
	}
	ln.Close()
	t.Run("flag", func(t *testing.T) {
		s := startInProcess(t, nil, "-dev", "-data", t.TempDir())
		if s.base != "http://127.0.0.1:8080" {
			t.Errorf("-dev without -addr listens on %s, want 127.0.0.1:8080", s.base)
		}
	})
	t.Run("environment", func(t *testing.T) {
		s := startInProcess(t, map[string]string{envName("dev"): "true", envName("data"): t.TempDir()})
		if s.base != "http://127.0.0.1:8080" {
			t.Errorf("%s without an address listens on %s, want 127.0.0.1:8080", envName("dev"), s.base)
		}
	})
	t.Run("an address given", func(t *testing.T) {
		s := startInProcess(t, map[string]string{envName("addr"): "127.0.0.1:0"}, "-dev", "-data", t.TempDir())
		if s.base == "http://127.0.0.1:8080" {
			t.Errorf("-dev with %s listens on %s, want the given address", envName("addr"), s.base)
		}
	})
}

func TestBadFlagsBinary(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"short ttl", []string{"-heartbeat-ttl", "10ms"}, "heartbeat ttl 10ms is too short"},
		{"unknown flag", []string{"-bogus"}, "flag provided but not defined: -bogus"},
		{"bad duration", []string{"-idle-after", "soon"}, `invalid value "soon" for flag -idle-after`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := append(baseArgs(t.TempDir(), "-api-key", apiKey), tc.args...)
			code, _, stderr := runBinary(t, nil, args...)
			if code == 0 {
				t.Errorf("exit code 0, want non-zero; stderr:\n%s", stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, stderr)
			}
			if strings.Contains(stderr, "presenced listening") {
				t.Errorf("it started listening:\n%s", stderr)
			}
		})
	}
}

// A listen address in use is an error, not a hang.
func TestAddressInUse(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	code, _, stderr := runBinary(t, nil, "-addr", ln.Addr().String(), "-data", t.TempDir(), "-api-key", apiKey)
	if code == 0 || !strings.Contains(stderr, "presenced: listen:") {
		t.Errorf("exit code %d, want non-zero with \"presenced: listen:\"; stderr:\n%s", code, stderr)
	}
}

// The quick configuration errors, in-process.
func TestRunConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		env       map[string]string
		args      []string
		want      string
		untouched bool // the data directory stays empty
	}{
		// The durations are checked by app.New, after the secrets exist.
		{"short ttl", nil, []string{"-heartbeat-ttl", "10ms"}, "heartbeat ttl 10ms is too short", false},
		{"short ttl from env", map[string]string{envName("heartbeat-ttl"): "10ms"}, nil, "heartbeat ttl 10ms is too short", false},
		{"short idle-after", nil, []string{"-idle-after", "1ms"}, "idle-after 1ms is too short", false},
		{"bad env value", map[string]string{envName("heartbeat-ttl"): "soon"}, nil, envName("heartbeat-ttl"), true},
		{"bad env bool", map[string]string{envName("dev"): "maybe"}, nil, envName("dev"), true},
		{"unknown flag", nil, []string{"-bogus"}, "flag provided but not defined: -bogus", true},
		{"positional argument", nil, []string{"serve"}, `unexpected arguments ["serve"]`, true},
		{"bad log level", nil, []string{"-log-level", "loud"}, "-log-level", true},
		{"bad print-token id", nil, []string{"-print-token", strings.Repeat("a", 65)}, "-print-token", true},
		{"print-token id with a comma", nil, []string{"-print-token", "a,b"}, "-print-token", true},
		{"print-token-rooms alone", nil, []string{"-print-token-rooms", "doc-42"}, "give -print-token too", true},
		{"bad print-token-rooms", nil, []string{"-print-token", "alice", "-print-token-rooms", "doc-42,a*b"}, `-print-token-rooms: entry 1 "a*b" has a "*" at byte 1`, true},
		{"data is a file", nil, []string{"-data", "/dev/null"}, "data directory", false},
		{"no device allowed", nil, []string{"-max-devices", "0"}, "-max-devices 0: between 1 and 1000", true},
		{"more devices than a record counts", nil, []string{"-max-devices", "1001"}, "-max-devices 1001: between 1 and 1000", true},
		{"negative close grace", nil, []string{"-close-grace", "-1s"}, `invalid value "-1s" for flag -close-grace: -1s is negative (0 turns the grace off)`, true},
		{"negative close grace from env", map[string]string{envName("close-grace"): "-5ms"}, nil, envName("close-grace") + `="-5ms": -5ms is negative`, true},
		{"negative device cap from env", map[string]string{envName("max-devices"): "-1"}, nil, "-max-devices -1", true},
		{"no subscription allowed", nil, []string{"-max-subscriptions", "0"}, "-max-subscriptions 0: at least 1", true},
		{"bad subscription cap from env", map[string]string{envName("max-subscriptions"): "many"}, nil, envName("max-subscriptions"), true},
		{"no async threshold", map[string]string{envName("fanout-async-threshold"): "0"}, nil, "-fanout-async-threshold 0: at least 1", true},
		{"no token lifetime", nil, []string{"-max-token-lifetime", "0s"}, "-max-token-lifetime 0s: at least 1s", true},
		{"negative token lifetime from env", map[string]string{envName("max-token-lifetime"): "-1h"}, nil, "-max-token-lifetime -1h0m0s", true},
		{"kafka broker without a port", nil, []string{"-kafka-brokers", "kafka1"}, `kafka broker "kafka1": want host:port`, false},
		{"kafka brokers from env, one without a port", map[string]string{envName("kafka-brokers"): "kafka1:9092,kafka2"}, nil, `kafka broker "kafka2": want host:port`, false},
		{"kafka without a group", nil, []string{"-kafka-brokers", "kafka1:9092", "-kafka-group="}, "-kafka-group", true},
		{"per-address cap above the node's", nil, []string{"-max-conns", "100", "-max-conns-per-ip", "101"}, "connections per address 101 (-max-conns-per-ip) above the 100 of the node (-max-conns)", true},
		{"per-address cap above the node's from env", map[string]string{envName("max-conns"): "100", envName("max-conns-per-ip"): "500"}, nil, "connections per address 500", true},
		{"pending cap above the node's", nil, []string{"-max-conns", "100", "-max-pending-conns", "200"}, "pending connections 200 (-max-pending-conns) above the 100 of the node", true},
		{"allowed origin with a path", nil, []string{"-allowed-origins", "https://app.example.com/"}, `-allowed-origins: origin "https://app.example.com/": an origin has no path`, true},
		{"allowed origin null from env", map[string]string{envName("allowed-origins"): "https://ok.example.com,null"}, nil, `-allowed-origins: origin "null"`, true},
		{"allowed origin with a bad wildcard", nil, []string{"-allowed-origins", "https://*.com"}, `-allowed-origins: origin "https://*.com"`, true},
		{"allowed host with a scheme", nil, []string{"-allowed-hosts", "https://presence.example.com"}, `-allowed-hosts: host "https://presence.example.com": want a host name`, true},
		{"allowed host with a port from env", map[string]string{envName("allowed-hosts"): "ok.example.com,presence.example.com:443"}, nil, `-allowed-hosts: host "presence.example.com:443": a host name has no port`, true},
		// Credentials shorter than 32 bytes, named with where they came from.
		{"short api key", nil, []string{"-api-key", "k"}, "-api-key (PRESENCE_API_KEY) is 1 bytes long; at least 32 bytes are required outside -dev", true},
		{"api key of 31 bytes", nil, []string{"-api-key", strings.Repeat("k", 31)}, "-api-key (PRESENCE_API_KEY) is 31 bytes long", true},
		{"short jwt secret", nil, []string{"-jwt-secret", "s3cret"}, "-jwt-secret (PRESENCE_JWT_SECRET) is 6 bytes long; at least 32 bytes are required outside -dev", true},
		{"short jwt secret from env", map[string]string{envName("jwt-secret"): "s"}, nil, "-jwt-secret (PRESENCE_JWT_SECRET) is 1 bytes long", true},
		{"short jwt secret, printing a token", nil, []string{"-jwt-secret", "s", "-print-token", "alice"}, "-jwt-secret (PRESENCE_JWT_SECRET) is 1 bytes long", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			args := append(baseArgs(dir, "-api-key", apiKey), tc.args...)
			stdout, stderr, err := runQuick(t, tc.env, args...)
			if err == nil {
				t.Fatalf("run returned nil, want an error with %q; stdout %q stderr:\n%s", tc.want, stdout, stderr)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q lacks %q", err, tc.want)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if tc.untouched {
				if ents, _ := os.ReadDir(dir); len(ents) != 0 {
					t.Errorf("the data directory was written: %v", ents)
				}
			}
		})
	}
}

// TestShortStoredSecret: a key under the data directory (written by hand,
// or by an old build) is held to the same minimum and named by its file.
func TestShortStoredSecret(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"api-key", "jwt-secret"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, name), []byte("short\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, _, err := runQuick(t, nil, baseArgs(dir)...)
			want := filepath.Join(dir, name) + " (the stored -" + name + ") is 5 bytes long; at least 32 bytes"
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("err %v, want one saying %q", err, want)
			}
		})
	}
}

// TestShortSecretsUnderDev: -dev takes any key (it accepts no credentials
// at all anyway) and still checks it.
func TestShortSecretsUnderDev(t *testing.T) {
	t.Parallel()
	s := startInProcess(t, nil, baseArgs(t.TempDir(), "-dev", "-api-key", "k", "-jwt-secret", "s")...)
	if code, b := s.do("GET", "/metrics", "k", nil); code != http.StatusOK {
		t.Errorf("the short key under -dev: %d %s, want 200", code, b)
	}
	if code, b := s.do("GET", "/metrics", "wrong", nil); code != http.StatusUnauthorized {
		t.Errorf("a wrong key under -dev: %d %s, want 401", code, b)
	}
}

// TestTokenFlags: -max-token-lifetime, -token-audience and -token-issuer
// reach the server's token checks and -print-token's tokens.
func TestTokenFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	flags := []string{"-jwt-secret", testSecret, "-max-token-lifetime", "1h", "-token-audience", "presenced", "-token-issuer", "https://app.example"}
	s := startInProcess(t, nil, baseArgs(dir, append([]string{"-api-key", apiKey}, flags...)...)...)
	beat := func(tok string) (int, []byte) {
		return s.do("POST", "/v1/heartbeat", tok, map[string]any{"device_id": "d1"})
	}
	sign := func(tk auth.Token, ttl time.Duration) string {
		t.Helper()
		tok, err := tk.Sign([]byte(testSecret), time.Now(), ttl)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	full := auth.Token{User: "alice", Audience: "presenced", Issuer: "https://app.example"}
	if code, b := beat(sign(full, time.Hour)); code != http.StatusOK {
		t.Errorf("a 1h token with aud and iss: %d %s, want 200", code, b)
	}
	for _, tc := range []struct {
		name string
		tok  string
		want string
	}{
		{"a 2h token", sign(full, 2*time.Hour), "maximum token lifetime of 1h0m0s"},
		{"no aud", sign(auth.Token{User: "alice", Issuer: full.Issuer}, time.Hour), `audience must include \"presenced\"`},
		{"no iss", sign(auth.Token{User: "alice", Audience: full.Audience}, time.Hour), `issuer must be \"https://app.example\"`},
	} {
		code, b := beat(tc.tok)
		if code != http.StatusUnauthorized || !strings.Contains(string(b), tc.want) || !strings.Contains(string(b), `"code":"unauthorized"`) {
			t.Errorf("%s: %d %s, want 401 unauthorized saying %q", tc.name, code, b, tc.want)
		}
	}

	// -print-token signs for the lifetime, audience and issuer in force.
	stdout, _, err := runQuick(t, nil, append([]string{"-data", dir, "-print-token", "carol"}, flags...)...)
	if err != nil {
		t.Fatal(err)
	}
	tok := strings.TrimSpace(stdout)
	if hb := s.heartbeat(tok, "", "d1"); hb["user_id"] != "carol" {
		t.Errorf("heartbeat with the printed token: %v", hb)
	}
	var c jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(tok, &c); err != nil {
		t.Fatal(err)
	}
	if life := c.ExpiresAt.Sub(c.IssuedAt.Time); life != time.Hour {
		t.Errorf("printed token lives %s, want the -max-token-lifetime of 1h", life)
	}
}

func TestRunHelp(t *testing.T) {
	t.Parallel()
	_, stderr, err := runQuick(t, nil, "-h")
	if err != nil {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"Usage: presenced", "-heartbeat-ttl", envName("heartbeat-ttl"), "INSECURE"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("-h output lacks %q:\n%s", want, stderr)
		}
	}
}

func TestRunPrintToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	stdout, _, err := runQuick(t, nil, "-data", dir, "-jwt-secret", testSecret, "-print-token", "carol")
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(stdout)
	s := startInProcess(t, nil, baseArgs(dir, "-jwt-secret", testSecret)...)
	if hb := s.heartbeat(token, "", "d1"); hb["user_id"] != "carol" {
		t.Errorf("heartbeat with the printed token: %v", hb)
	}
	if code, b := s.do("POST", "/v1/heartbeat", token+"x", map[string]any{"device_id": "d1"}); code != http.StatusUnauthorized {
		t.Errorf("tampered token: %d %s, want 401", code, b)
	}
}

// TestRunPrintTokenRooms: -print-token-rooms becomes the token's rooms
// claim, which the server's checks read back.
func TestRunPrintTokenRooms(t *testing.T) {
	t.Parallel()
	stdout, _, err := runQuick(t, nil, "-data", t.TempDir(), "-jwt-secret", testSecret, "-print-token", "carol",
		"-print-token-rooms", "doc-42,team-7-*", "-print-token-rooms", "lobby")
	if err != nil {
		t.Fatal(err)
	}
	p, err := auth.New(auth.Config{JWTSecret: []byte(testSecret)}).Credential(strings.TrimSpace(stdout))
	if err != nil || p.UserID != "carol" {
		t.Fatalf("the printed token: %+v, %v; want carol's", p, err)
	}
	for room, want := range map[string]bool{"doc-42": true, "team-7-a": true, "lobby": true, "doc-4": false, "team-8": false} {
		if got := p.AllowsRoom(room); got != want {
			t.Errorf("the printed token allows %q: %v, want %v", room, got, want)
		}
	}
}

func TestPprofAddrMustBeLoopback(t *testing.T) {
	t.Parallel()
	_, _, err := runQuick(t, nil, baseArgs(t.TempDir(), "-api-key", apiKey, "-pprof-addr", "0.0.0.0:0")...)
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("-pprof-addr 0.0.0.0:0: err %v, want a refusal naming loopback", err)
	}
}

func TestRunVersion(t *testing.T) {
	t.Parallel()
	stdout, _, err := runQuick(t, nil, "-version")
	if err != nil || !strings.HasPrefix(stdout, "presenced ") || !strings.Contains(stdout, runtime.Version()) {
		t.Fatalf("-version: %q %v, want presenced, the version and the Go release", stdout, err)
	}
}

// TestLogFormat: -log-format json writes one JSON object a line; an
// unknown format is refused.
func TestLogFormat(t *testing.T) {
	t.Parallel()
	_, stderr, err := runQuick(t, nil, "-log-format", "json", "-data", t.TempDir(), "-print-token", "42")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	for _, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil || m["msg"] == nil || m["level"] == nil {
			t.Errorf("not a JSON log line: %q (%v)", line, err)
		}
	}
	if len(lines) == 0 || !strings.Contains(stderr, `"version"`) {
		t.Errorf("no version logged at start:\n%s", stderr)
	}
	if _, _, err := runQuick(t, nil, "-log-format", "yaml", "-data", t.TempDir()); err == nil || !strings.Contains(err.Error(), "-log-format") {
		t.Errorf("-log-format yaml: %v, want it refused", err)
	}
}

// TestHealthcheck: -healthcheck URL (the container image's HEALTHCHECK)
// succeeds on a 200 and fails on anything else, an unreachable node and a
// URL that is not http(s) included; it ignores the environment's settings.
func TestHealthcheck(t *testing.T) {
	t.Parallel()
	s := startInProcess(t, nil, baseArgs(t.TempDir())...)
	for _, path := range []string{"/healthz", "/readyz"} {
		out, _, err := runQuick(t, nil, "-healthcheck", s.base+path)
		if err != nil || !strings.Contains(out, "200 OK") {
			t.Errorf("-healthcheck %s: %q %v, want success", path, out, err)
		}
	}
	// The environment of a container applies to the server, not to the check.
	if _, _, err := runQuick(t, map[string]string{envName("healthcheck"): "http://127.0.0.1:1/healthz"}, "-healthcheck", s.base+"/healthz"); err != nil {
		t.Errorf("-healthcheck with %s set: %v", envName("healthcheck"), err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/healthz"
	ln.Close()
	for _, tc := range []struct{ url, want string }{
		{s.base + "/metrics", "401"},           // not a 200
		{s.base + "/nope", "404"},              // not a 200
		{closed, "refused"},                    // nobody listening
		{"127.0.0.1:8081/healthz", "http://"},  // no scheme
		{"ftp://127.0.0.1/healthz", "http://"}, // not http
		{"http:///healthz", "http://"},         // no host
	} {
		if _, _, err := runQuick(t, nil, "-healthcheck", tc.url); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("-healthcheck %s: %v, want an error naming %q", tc.url, err, tc.want)
		}
	}
	// Only an action: without -healthcheck, its environment variable does
	// not turn a node into a check.
	if _, _, err := runQuick(t, map[string]string{envName("healthcheck"): s.base + "/healthz"}, "-version"); err != nil {
		t.Errorf("-version with %s set: %v", envName("healthcheck"), err)
	}
}

// TestBuildInfoMetric: the built binary's /metrics says, in
// presenced_build_info, what its -version prints.
func TestBuildInfoMetric(t *testing.T) {
	t.Parallel()
	code, out, stderr := runBinary(t, nil, "-version")
	if code != 0 {
		t.Fatalf("-version: exit %d: %s", code, stderr)
	}
	p := start(t, nil, baseArgs(t.TempDir(), "-api-key", apiKey, "-jwt-secret", testSecret)...)
	status, b := p.do("GET", "/metrics", apiKey, nil)
	if status != http.StatusOK {
		t.Fatalf("/metrics: %d %s", status, b)
	}
	m := regexp.MustCompile(`(?m)^presenced_build_info\{go="([^"]*)",revision="([^"]*)",version="([^"]*)"\} 1$`).FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("no presenced_build_info in /metrics:\n%s", b)
	}
	goVer, rev, ver := m[1], m[2], m[3]
	out = strings.TrimSpace(out)
	if !strings.HasPrefix(out, "presenced "+ver+" ") || !strings.HasSuffix(out, " "+goVer) || (rev != "") != strings.Contains(out, "("+rev) {
		t.Errorf("-version says %q, /metrics version=%q revision=%q go=%q", out, ver, rev, goVer)
	}
	p.stopWith(t, syscall.SIGTERM)
}

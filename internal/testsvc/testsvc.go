// Package testsvc starts real Redis, PostgreSQL and NATS JetStream servers
// for tests: private processes on free 127.0.0.1 ports, each in its own
// temporary directory. No mocks: the store and bus tests talk to the real
// thing, and fault tests Stop, Kill (SIGKILL), Pause and Resume
// (SIGSTOP/SIGCONT: a hung server) and Start them again on the same port
// and data; a Proxy (NewProxy) stalls or cuts a link (a partition).
//
// Redis(t), Postgres(t) and NATS(t) start a private server for one test;
// use them for fault tests. SharedRedis(t), SharedPostgres(t) and
// SharedNATS(t) start one server per test binary, for tests isolated by
// database (s.NewDatabase(t)), key prefix or subject (Unique(t)); a shared
// server refuses Stop, Kill and Start, and the package's TestMain stops it:
//
//	func TestMain(m *testing.M) { testsvc.Main(m) }
//
// RedisCluster and RedisClusterReplicas start a Redis Cluster (about 2 s)
// for failover tests (WaitPromoted, Failover, Rejoin). StartRedis,
// StartPostgres and StartNATS are the variants without a testing.TB.
//
// Binaries are looked up on PATH and in Debian's places; a missing one
// fails the test naming the Debian package (scripts/test.sh installs
// them): a suite that silently skips its real backends is a failing suite.
// Only under go test -short, the tier that needs nothing but Go, does a
// missing server skip the test instead (Fatal says which). As root,
// PostgreSQL runs as the postgres user. All of it is safe for concurrent use.
package testsvc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// StartTimeout bounds how long a server may take to accept connections
// after it is launched (initdb not included).
const StartTimeout = 30 * time.Second

// stopTimeout bounds a graceful stop before the server is killed.
const stopTimeout = 10 * time.Second

// Server is one real server process on 127.0.0.1. Its fields are fixed for
// its life, across restarts; the methods are safe for concurrent use.
type Server struct {
	Kind string // "redis", "postgres" or "nats"
	Port int
	Addr string // "127.0.0.1:port"
	URL  string // redis://127.0.0.1:port/0, postgres://postgres@127.0.0.1:port/postgres?sslmode=disable, nats://127.0.0.1:port
	Dir  string // the server's own temporary directory, removed by Close

	shared bool
	spec   spec

	mu     sync.Mutex // guards the fields below
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
	closed bool
}

// spec is what differs between kinds.
type spec struct {
	kind string
	// args returns the command line for a server on port in dir.
	args func(s *Server) []string
	// notRoot says the process must not run as root (see unprivileged).
	notRoot bool
	// ready dials the server once and reports whether it is serving.
	ready func(addr string) error
	// stopSig is the signal for a graceful stop.
	stopSig syscall.Signal
	// busPort says the server also listens on port+10000 (a Redis Cluster
	// node's bus), which must be free too.
	busPort bool
}

// Running reports whether the server process is up (started and not yet
// stopped or killed, and not exited by itself).
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runningLocked()
}

func (s *Server) runningLocked() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Start starts the server again on the same port and with the same data
// directory, after Stop or Kill, and waits until it accepts connections.
// PostgreSQL and NATS keep what they had written; Redis keeps nothing.
// Starting a running server is an error.
func (s *Server) Start() error {
	if s.shared {
		return errShared
	}
	return s.start()
}

var errShared = errors.New("testsvc: a shared server cannot be stopped or restarted; use Redis(t), Postgres(t) or NATS(t) for a private one")

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("testsvc: %s on %s is closed", s.Kind, s.Addr)
	}
	if s.runningLocked() {
		return fmt.Errorf("testsvc: %s on %s is already running", s.Kind, s.Addr)
	}
	deadline := time.Now().Add(StartTimeout)
	for {
		err := s.launchLocked(deadline)
		if err == nil {
			return nil
		}
		// The process died before it served: the port may still be held by
		// the previous run's last moments (or a killed PostgreSQL's
		// backends may still be leaving). Try again until the deadline.
		if !errors.Is(err, errExited) || time.Now().Add(200*time.Millisecond).After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var errExited = errors.New("exited before it was ready")

// launchLocked starts the process once and waits for it to be ready.
func (s *Server) launchLocked(deadline time.Time) error {
	logPath := filepath.Join(s.Dir, s.Kind+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("testsvc: %w", err)
	}
	defer logf.Close() // the child has its own copy
	fmt.Fprintf(logf, "--- testsvc: starting %s on %s at %s\n", s.Kind, s.Addr, time.Now().UTC().Format(time.RFC3339Nano))
	args := s.spec.args(s)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = s.Dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Env = serverEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid:   true,            // so Kill takes the server's children too
		Pdeathsig: syscall.SIGKILL, // no server outlives a crashed test binary
	}
	if s.spec.notRoot {
		cred, err := unprivileged()
		if err != nil {
			return err
		}
		cmd.SysProcAttr.Credential = cred
	}
	becomeSubreaper()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("testsvc: start %s: %w", s.Kind, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	var last error
	for {
		if last = s.spec.ready(s.Addr); last == nil {
			return nil
		}
		select {
		case <-exited:
			reapGroup(cmd, nil)
			return fmt.Errorf("testsvc: %s on %s %w (%v); its log:\n%s", s.Kind, s.Addr, errExited, cmd.ProcessState, s.LogTail(20))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			kids := killGroup(cmd)
			<-exited
			reapGroup(cmd, kids)
			return fmt.Errorf("testsvc: %s on %s not ready after %v: %v; its log:\n%s", s.Kind, s.Addr, StartTimeout, last, s.LogTail(20))
		}
	}
}

// Stop stops the server gracefully (killing it if it takes longer than a
// few seconds) and waits for it to exit. Stopping a stopped server does
// nothing.
func (s *Server) Stop() error {
	if s.shared {
		return errShared
	}
	return s.stop(s.spec.stopSig)
}

// Kill kills the server and all its processes at once (SIGKILL), as a
// crash would, and waits for them to exit. Killing a stopped
// server does nothing.
func (s *Server) Kill() error {
	if s.shared {
		return errShared
	}
	return s.stop(syscall.SIGKILL)
}

// Pause freezes the server and all its processes (SIGSTOP): connections stay open but nothing answers, as with a hung server
// or a network partition, until Resume. Stop, Kill and Close work on a
// paused server.
func (s *Server) Pause() error {
	return s.signalGroup(syscall.SIGSTOP)
}

// Resume lets a paused server go on (SIGCONT).
func (s *Server) Resume() error {
	return s.signalGroup(syscall.SIGCONT)
}

func (s *Server) signalGroup(sig syscall.Signal) error {
	if s.shared {
		return errShared
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.runningLocked() {
		return fmt.Errorf("testsvc: %s on %s is not running", s.Kind, s.Addr)
	}
	pid := s.cmd.Process.Pid
	if sig == syscall.SIGSTOP {
		syscall.Kill(pid, sig) // forks no more while we look
	}
	kids := descendants(pid)
	for _, k := range kids {
		syscall.Kill(k, sig)
	}
	if err := syscall.Kill(-pid, sig); err != nil {
		return fmt.Errorf("testsvc: %s on %s: %v: %w", s.Kind, s.Addr, sig, err)
	}
	if sig == syscall.SIGSTOP {
		for _, p := range append(kids, pid) {
			if err := AwaitStopped(p, stopTimeout); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Server) stop(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.runningLocked() {
		return nil
	}
	var kids []int
	if sig == syscall.SIGKILL {
		kids = killGroup(s.cmd)
	} else {
		s.cmd.Process.Signal(sig)
		// In case it was paused:
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGCONT)
		for _, k := range descendants(s.cmd.Process.Pid) {
			syscall.Kill(k, syscall.SIGCONT)
		}
	}
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		kids = killGroup(s.cmd)
		<-s.exited
	}
	reapGroup(s.cmd, kids)
	return nil
}

// killGroup kills the server at once: its process group, and the
// processes it forked that left the group (PostgreSQL's backends each
// start a session of their own). It returns those, for reapGroup.
func killGroup(cmd *exec.Cmd) []int {
	pid := cmd.Process.Pid
	syscall.Kill(pid, syscall.SIGSTOP) // forks no more while we look
	kids := descendants(pid)
	syscall.Kill(-pid, syscall.SIGKILL)
	syscall.Kill(pid, syscall.SIGKILL)
	for _, k := range kids {
		syscall.Kill(k, syscall.SIGKILL)
	}
	return kids
}

// descendants returns the pids of pid's children, theirs, and so on, read
// from /proc.
func descendants(pid int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		if pp, err := strconv.Atoi(f[1]); err == nil {
			children[pp] = append(children[pp], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		out = append(out, children[p]...)
		queue = append(queue, children[p]...)
	}
	return out
}

// reapGroup makes sure nothing of the server is left once its main
// process has exited: it kills the rest (a killed PostgreSQL's backends
// outlive their postmaster for a moment) and waits for them. They are our
// children because this process is a child subreaper (see launchLocked);
// otherwise they go to init, which in a container may never reap them.
func reapGroup(cmd *exec.Cmd, kids []int) {
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	for _, k := range kids {
		syscall.Kill(k, syscall.SIGKILL)
	}
	if !subreaper {
		return
	}
	for _, k := range kids {
		for {
			var ws syscall.WaitStatus
			if _, err := syscall.Wait4(k, &ws, 0, nil); err != syscall.EINTR {
				break // reaped, or not ours (ECHILD)
			}
		}
	}
}

var (
	subreaperOnce sync.Once
	subreaper     bool // this process adopts its orphaned descendants
)

// becomeSubreaper makes the test binary adopt the orphans of the servers
// it starts (prctl PR_SET_CHILD_SUBREAPER), so that reapGroup can wait for
// them.
func becomeSubreaper() {
	subreaperOnce.Do(func() {
		const prSetChildSubreaper = 36
		_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
		subreaper = errno == 0
	})
}

// Close kills the server and removes its directory. It is idempotent.
// Servers from Redis(t) and friends are closed at t.Cleanup.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	s.stop(syscall.SIGKILL)
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return os.RemoveAll(s.Dir)
}

// LogTail returns the last n lines the server wrote to its log. If the
// server panicked (nats-server is written in Go), the tail starts at the
// panic and its first stack frames instead, which say what crashed.
func (s *Server) LogTail(n int) string {
	b, err := os.ReadFile(filepath.Join(s.Dir, s.Kind+".log"))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	from := max(len(lines)-n, 0)
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "panic: ") || strings.HasPrefix(lines[i], "fatal error: ") {
			from = i
			break
		}
	}
	return strings.Join(lines[from:min(from+n, len(lines))], "\n")
}

// newServer makes the directory and picks the port of a server of sp.
func newServer(sp spec) (*Server, error) {
	sweepOnce.Do(sweep)
	dir, err := os.MkdirTemp(tempRoot(), "presenced-testsvc-"+sp.kind+"-")
	if err != nil {
		return nil, fmt.Errorf("testsvc: %w", err)
	}
	if err := markOwner(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	port, err := freePort()
	for try := 0; err == nil && sp.busPort && !portFree(port+10000); try++ {
		if try == 100 {
			err = errors.New("testsvc: no free port p with p+10000 free")
			break
		}
		port, err = freePort()
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &Server{Kind: sp.kind, Port: port, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir, spec: sp}
	return s, nil
}

// startNew starts a new server of sp, trying another port if the first
// one turned out to be taken by someone else in the meantime.
func startNew(sp spec, setup func(*Server) error, url func(*Server) string) (*Server, error) {
	var err error
	for try := 0; try < 3; try++ {
		var s *Server
		s, err = newServer(sp)
		if err != nil {
			return nil, err
		}
		s.URL = url(s)
		if setup != nil {
			if err = setup(s); err != nil {
				s.Close()
				return nil, err
			}
		}
		if err = s.start(); err == nil {
			return s, nil
		}
		s.Close()
		if !errors.Is(err, errExited) {
			return nil, err
		}
	}
	return nil, err
}

// ownerFile, in each directory this package makes, holds the pid of the
// test binary that made it.
const ownerFile = "testsvc.owner"

func markOwner(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("testsvc: %w", err)
	}
	return nil
}

var sweepOnce sync.Once

// sweep removes the directories left by test binaries that died without
// closing their servers (their servers died with them: Pdeathsig), or
// whose TestMain did not call Main.
func sweep() {
	dirs, _ := filepath.Glob(filepath.Join(tempRoot(), "presenced-testsvc-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue // being made right now, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(d)
		}
	}
}

// tempRoot is where servers' directories go: $PRESENCED_TESTSVC_DIR if
// set; else /dev/shm when it is a writable memory file system with room
// (servers start and copy clusters there several times faster than on
// disk, and a killed server still keeps what it wrote); else os.TempDir,
// unless its path is too long for a PostgreSQL socket path.
func tempRoot() string {
	rootOnce.Do(func() {
		if d := os.Getenv("PRESENCED_TESTSVC_DIR"); d != "" {
			root = d
			return
		}
		var st syscall.Statfs_t
		const minFree = 2 << 30
		if syscall.Statfs("/dev/shm", &st) == nil && st.Bavail*uint64(st.Bsize) >= minFree && syscall.Access("/dev/shm", 2 /* W_OK */) == nil {
			root = "/dev/shm"
			return
		}
		root = os.TempDir()
		if len(root) > 40 {
			root = "/tmp"
		}
	})
	return root
}

var (
	rootOnce sync.Once
	root     string
)

// freePort returns a port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("testsvc: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// portFree reports whether port is a free port on 127.0.0.1.
func portFree(port int) bool {
	if port > 65535 {
		return false
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// serverEnv is the environment of server processes: ours, minus what would
// point a server or its tools somewhere else.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

// Fatal fails tb with err, the error of a Start function, as tb.Fatal
// does. Under go test -short it skips tb instead if err says a server is
// not installed here: the short tier runs on a machine with Go alone.
func Fatal(tb testing.TB, err error) {
	tb.Helper()
	fatal(tb, err, testing.Short())
}

func fatal(tb testing.TB, err error, short bool) {
	tb.Helper()
	var ni *notInstalledError
	if short && errors.As(err, &ni) {
		tb.Skipf("skipped under -short, where servers need not be installed (without -short this fails): %v", err)
		return
	}
	tb.Fatal(err)
}

// notInstalledError says that a server's programs are not on this
// machine (or cannot be run as they must be).
type notInstalledError struct{ msg string }

func (e *notInstalledError) Error() string { return e.msg }

// fromTB starts a private server with start, failing tb if it cannot (see
// Fatal), and closes it at tb's cleanup (logging its log's tail if the
// test failed).
func fromTB(tb testing.TB, start func() (*Server, error)) *Server {
	tb.Helper()
	s, err := start()
	if err != nil {
		Fatal(tb, err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("testsvc: last lines of %s on %s:\n%s", s.Kind, s.Addr, s.LogTail(15))
		}
		s.Close()
	})
	return s
}

var uniqueN atomic.Int64

// Unique returns a name no other call in this test binary returns, made of
// [a-z0-9_] from tb's name, for a key prefix, a database, a subject token
// or a stream name: "t7_testfoo_bar".
func Unique(tb testing.TB) string {
	var b strings.Builder
	b.WriteString("t")
	b.WriteString(strconv.FormatInt(uniqueN.Add(1), 10))
	b.WriteByte('_')
	n := 0
	for _, r := range strings.ToLower(tb.Name()) {
		if n >= 40 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		n++
	}
	return b.String()
}

// Shared servers: one per kind per test binary, started on first use.

type sharedServer struct {
	once sync.Once
	s    *Server
	err  error
}

var (
	sharedMu sync.Mutex // guards shared
	shared   = map[string]*sharedServer{}
)

func getShared(tb testing.TB, kind string, start func() (*Server, error)) *Server {
	tb.Helper()
	sharedMu.Lock()
	ss := shared[kind]
	if ss == nil {
		ss = &sharedServer{}
		shared[kind] = ss
	}
	sharedMu.Unlock()
	ss.once.Do(func() {
		ss.s, ss.err = start()
		if ss.s != nil {
			ss.s.shared = true
		}
	})
	if ss.err != nil {
		Fatal(tb, ss.err)
	}
	return ss.s
}

// StopShared closes the shared servers this test binary started and
// removes its PostgreSQL template cluster. Main calls it; a TestMain of its
// own calls it after m.Run. (Directories a binary leaves behind, if it
// does neither, are removed by the next test binary that uses testsvc.)
func StopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	for _, ss := range shared {
		if ss.s != nil {
			ss.s.Close()
		}
	}
	shared = map[string]*sharedServer{}
	removePgTemplate()
}

// Main is a TestMain for packages that use the shared servers: it runs the
// tests, closes the shared servers and exits with the tests' code.
func Main(m *testing.M) {
	code := m.Run()
	StopShared()
	os.Exit(code)
}

// Binaries.

// findBinary looks for name on PATH, then in dirs.
func findBinary(name, pkg string, dirs ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", missing(name, pkg, dirs)
}

func missing(name, pkg string, dirs []string) error {
	how := "sudo apt-get install -y " + pkg + " (or run ./scripts/test.sh, which installs it)"
	ci := ""
	if os.Getenv("CI") == "true" {
		ci = " under CI: the install step of scripts/test.sh did not provide it"
	}
	return &notInstalledError{fmt.Sprintf("testsvc: %s not found on PATH nor in %s%s; the real-backend tests need it: install Debian's package %q: %s",
		name, strings.Join(dirs, ", "), ci, pkg, how)}
}

// tail returns the last lines of b, for error messages.
func tail(b []byte, n int) string {
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// AwaitStopped waits until every thread of process pid is stopped: a
// SIGSTOP is delivered asynchronously, and a thread that runs on for a
// moment after kill(2) returned can still answer what comes meanwhile.
func AwaitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !threadsStopped(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("testsvc: process %d not stopped within %v of SIGSTOP", pid, timeout)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// threadsStopped reports whether every thread of pid is in state T
// (stopped) or t (traced); a process that is gone, or has exited and
// waits to be reaped (Z, X: a PostgreSQL backend that ended as the
// server was paused), counts as stopped: it runs no more.
func threadsStopped(pid int) bool {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return true
	}
	for _, task := range tasks {
		b, err := os.ReadFile(dir + "/" + task.Name() + "/stat")
		if err != nil {
			continue // the thread ended
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return false
		}
		if st := b[i+2]; st != 'T' && st != 't' && st != 'Z' && st != 'X' {
			return false
		}
	}
	return true
}

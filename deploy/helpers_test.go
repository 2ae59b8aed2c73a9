// The tests of this directory check the deployment files beside them
// against the real binary: the Dockerfile's build is run and its result
// started alone in an empty root directory as the image's user, the
// systemd unit and the rendered Kubernetes overlays are parsed and every flag,
// environment variable, port and probe path they name is tried on a
// running node, and the Grafana dashboard's queries are checked against the
// metrics a node exposes.
package deploy

import (
	"context"
	"debug/elf"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testsvc"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if builtDir != "" {
		os.RemoveAll(builtDir)
	}
	testsvc.StopShared()
	os.Exit(code)
}

// waitTimeout bounds every wait for a node to start, answer or stop.
const waitTimeout = 60 * time.Second

// repoRoot is the build context of the Dockerfile (the repository root).
const repoRoot = ".."

// The binary, built once per test run by dockerBuild.
var (
	buildOnce sync.Once
	builtDir  string
	built     *image
	buildErr  error
)

// image is what the Dockerfile's build produced and where the final stage
// puts it.
type image struct {
	df     *dockerfile
	binary string // the built binary, on this machine
	outDir string // the build stage's -o path (/out/presenced)
	dirs   map[string]bool
}

// dockerBuild runs the build stage's `go build` line in the repository
// root (the stage's WORKDIR, which `COPY . .` fills with the build context)
// with the stage's ARG defaults and ENV, and only -o pointed elsewhere. It
// returns the parsed Dockerfile and the binary.
func dockerBuild(t *testing.T) *image {
	t.Helper()
	buildOnce.Do(func() { built, buildErr = build(t) })
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

func build(t *testing.T) (*image, error) {
	df, err := parseDockerfile("Dockerfile")
	if err != nil {
		return nil, err
	}
	st := df.stage("build")
	if st == nil {
		return nil, fmt.Errorf("Dockerfile: no stage named build")
	}
	env := map[string]string{}
	for _, in := range st.all("ARG") {
		for k, v := range keyValues(t, in) {
			env[k] = v
		}
	}
	for _, in := range st.all("ENV") {
		for k, v := range keyValues(t, in) {
			env[k] = v
		}
	}
	img := &image{df: df, dirs: map[string]bool{}}
	var goBuild []string
	for _, in := range st.all("RUN") {
		words, err := shellWords(in.args)
		if err != nil {
			return nil, fmt.Errorf("Dockerfile:%d: %v", in.line, err)
		}
		switch {
		case len(words) >= 2 && words[0] == "go" && words[1] == "build":
			if goBuild != nil {
				return nil, fmt.Errorf("Dockerfile:%d: a second go build", in.line)
			}
			goBuild = words
		case len(words) >= 3 && words[0] == "mkdir" && words[1] == "-p":
			for _, d := range words[2:] {
				img.dirs[d] = true
			}
		case len(words) == 3 && words[0] == "go" && words[1] == "mod" && words[2] == "download":
		default:
			return nil, fmt.Errorf("Dockerfile:%d: RUN %s: the test does not know this step; teach it", in.line, in.args)
		}
	}
	if goBuild == nil {
		return nil, fmt.Errorf("Dockerfile: no RUN go build in the build stage")
	}
	builtDir, err = os.MkdirTemp("", "presenced-deploy-")
	if err != nil {
		return nil, err
	}
	img.binary = filepath.Join(builtDir, "presenced")
	for i, w := range goBuild {
		if w == "-o" && i+1 < len(goBuild) {
			img.outDir = goBuild[i+1]
			goBuild[i+1] = img.binary
		}
	}
	if img.outDir == "" {
		return nil, fmt.Errorf("Dockerfile: go build without -o")
	}
	// The host's environment, less what would change the build: the
	// Dockerfile's ARG and ENV stand for those.
	cmd := exec.Command(goBuild[0], goBuild[1:]...)
	cmd.Dir = repoRoot
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "GOFLAGS", "GOOS", "GOARCH", "CGO_ENABLED", "GOEXPERIMENT", "GOAMD64", "GOARM", "GO386", "CC":
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("the Dockerfile's %q: %v\n%s", goBuild, err, out)
	}
	return img, nil
}

// checkStatic fails unless path is an ELF executable with no interpreter
// and no shared libraries: it runs on an empty base image.
func checkStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has an ELF interpreter: not a static binary", path)
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("%s needs shared libraries %q (%v)", path, libs, err)
	}
}

// requireRoot: chroot and changing user need root. The suite runs as root
// here and in CI; elsewhere the chrooted tests say why they cannot run
// (a failure under CI=true, where they must run, but for the -short tier).
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	msg := fmt.Sprintf("running the binary in an empty root directory (chroot) as another user needs root; this test runs as uid %d", os.Geteuid())
	if os.Getenv("CI") == "true" && !testing.Short() {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// syncBuffer is a process's output, read while it writes.
type syncBuffer = testsvc.Output

// node is a running presenced process.
type node struct {
	cmd    *exec.Cmd
	logs   *syncBuffer
	exited chan struct{}
	addr   string // where clients connect, from the log
	health string // the -health-addr listener, from the log ("" without)
}

// Both log formats: text (logfmt) and json.
var (
	listeningRE = regexp.MustCompile(`(?:msg="presenced listening" addr=|"msg":"presenced listening","addr":")([^\s"]+)`)
	healthRE    = regexp.MustCompile(`(?:msg="health checks listening" addr=|"msg":"health checks listening","addr":")([^\s"]+)`)
)

// startNode starts cmd and waits for its listening lines (wantHealth: the
// health listener's too). It is killed when the test ends.
func startNode(t *testing.T, cmd *exec.Cmd, wantHealth bool) *node {
	t.Helper()
	n := &node{cmd: cmd, logs: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = n.logs, n.logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %q: %v", cmd.Args, err)
	}
	go func() {
		cmd.Wait()
		close(n.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-n.exited:
		default:
			cmd.Process.Kill()
			<-n.exited
		}
	})
	deadline := time.Now().Add(waitTimeout)
	for {
		logs := n.logs.String()
		if m := listeningRE.FindStringSubmatch(logs); m != nil {
			n.addr = m[1]
		}
		if m := healthRE.FindStringSubmatch(logs); m != nil {
			n.health = m[1]
		}
		if n.addr != "" && (n.health != "" || !wantHealth) {
			return n
		}
		select {
		case <-n.exited:
			t.Fatalf("%q exited (%v) before listening; logs:\n%s", cmd.Args, cmd.ProcessState, logs)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q not listening within %s; logs:\n%s", cmd.Args, waitTimeout, logs)
		}
	}
}

// stop sends SIGTERM and insists on a clean exit.
func (n *node) stop(t *testing.T) {
	t.Helper()
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(waitTimeout):
		t.Fatalf("no exit within %s of SIGTERM; logs:\n%s", waitTimeout, n.logs)
	}
	if code := n.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGTERM; logs:\n%s", code, n.logs)
	}
}

// get requests path on addr (host:port; an unspecified host is loopback)
// with an optional bearer credential, and returns the status and body.
func get(t *testing.T, addr, path, cred string) (int, string) {
	t.Helper()
	return do(t, "GET", addr, path, cred, "")
}

func do(t *testing.T, method, addr, path, cred, body string) (int, string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+net.JoinHostPort(host, port)+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s on %s: %v", method, path, addr, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitReady polls /readyz on addr until it answers 200.
func waitReady(t *testing.T, n *node, addr string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		code, body := get(t, addr, "/readyz", "")
		if code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz on %s: %d %s after %s; logs:\n%s", addr, code, body, waitTimeout, n.logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package deploy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// dockerfile is what the tests need of deploy/Dockerfile: its stages, each
// a list of instructions in order.
type dockerfile struct {
	stages []*stage
}

type stage struct {
	from, name string
	instrs     []instr
}

// instr is one instruction: its keyword (upper case) and the rest of its
// line, continuation lines joined.
type instr struct {
	cmd, args string
	line      int
}

// parseDockerfile reads a Dockerfile: comments and blank lines dropped,
// backslash continuations joined, instructions grouped by stage.
func parseDockerfile(path string) (*dockerfile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	df := &dockerfile{}
	sc := bufio.NewScanner(f)
	var cur strings.Builder
	n, start := 0, 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if strings.HasSuffix(line, `\`) {
			cur.WriteString(strings.TrimSuffix(line, `\`))
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(line)
		text := cur.String()
		cur.Reset()
		cmd, args, _ := strings.Cut(text, " ")
		in := instr{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := &stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			} else if len(f) != 1 {
				return nil, fmt.Errorf("%s:%d: FROM %s: want an image and perhaps AS name", path, start, in.args)
			}
			df.stages = append(df.stages, st)
			continue
		}
		if len(df.stages) == 0 {
			if in.cmd == "ARG" {
				continue // global ARGs: none used here
			}
			return nil, fmt.Errorf("%s:%d: %s before FROM", path, start, in.cmd)
		}
		st := df.stages[len(df.stages)-1]
		st.instrs = append(st.instrs, in)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur.Len() != 0 {
		return nil, fmt.Errorf("%s: ends in a continuation", path)
	}
	return df, nil
}

func (df *dockerfile) stage(name string) *stage {
	for _, s := range df.stages {
		if s.name == name {
			return s
		}
	}
	return nil
}

func (df *dockerfile) final() *stage { return df.stages[len(df.stages)-1] }

// all returns the arguments of every instruction cmd of the stage.
func (s *stage) all(cmd string) []instr {
	var out []instr
	for _, in := range s.instrs {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// one returns the arguments of the stage's only instruction cmd.
func (s *stage) one(t *testing.T, cmd string) instr {
	t.Helper()
	all := s.all(cmd)
	if len(all) != 1 {
		t.Fatalf("Dockerfile stage %q: %d %s instructions, want 1", s.name, len(all), cmd)
	}
	return all[0]
}

// execForm decodes a JSON-array (exec form) argument list; the shell form
// would need a shell the image does not have.
func execForm(t *testing.T, in instr) []string {
	t.Helper()
	var args []string
	if err := json.Unmarshal([]byte(in.args), &args); err != nil {
		t.Fatalf("Dockerfile:%d: %s %s: want the exec form (a JSON array; the image has no shell): %v", in.line, in.cmd, in.args, err)
	}
	return args
}

// keyValues parses ENV and ARG arguments: name=value pairs separated by
// spaces, values unquoted or in double quotes (no spaces inside).
func keyValues(t *testing.T, in instr) map[string]string {
	t.Helper()
	kv := map[string]string{}
	for _, f := range strings.Fields(in.args) {
		k, v, ok := strings.Cut(f, "=")
		if !ok && in.cmd == "ENV" {
			t.Fatalf("Dockerfile:%d: ENV %s: want name=value pairs", in.line, in.args)
		}
		kv[k] = strings.Trim(v, `"`)
	}
	return kv
}

// shellWords splits a RUN command the way sh would for the simple
// commands used here: words separated by blanks, double or single quotes
// grouping; anything that needs a real shell (operators, variables,
// substitutions) is refused so the test never builds differently.
func shellWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	var quote rune
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				if quote == '"' && strings.ContainsRune("$`\\", r) {
					return nil, fmt.Errorf("%q: %q inside double quotes", s, r)
				}
				w.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case strings.ContainsRune("&|;<>()$`\\*?[]{}~#", r):
			return nil, fmt.Errorf("%q: %q needs a shell; keep the build line a simple command", s, r)
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("%q: unterminated quote", s)
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

func TestShellWords(t *testing.T) {
	got, err := shellWords(`go build -trimpath -ldflags="-s -w" -o /out/presenced ./cmd/presenced`)
	want := []string{"go", "build", "-trimpath", "-ldflags=-s -w", "-o", "/out/presenced", "./cmd/presenced"}
	if err != nil || strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q %v, want %q", got, err, want)
	}
	for _, bad := range []string{"go build && rm x", "go build $X", `go build "a`, "go build `x`", "go build ; true"} {
		if _, err := shellWords(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestDockerfile builds the binary as deploy/Dockerfile does, puts it
// alone into an empty directory laid out as the final stage's COPY lines
// say (the CA bundle left out: it serves TLS to backends only), and runs
// it there (chroot) as the image's USER with its ENTRYPOINT and CMD. The
// node must serve /healthz and /readyz on the exposed ports, keep its data
// under the /data volume, answer the HEALTHCHECK's command and stop
// cleanly on SIGTERM, after which the check fails.
func TestDockerfile(t *testing.T) {
	requireRoot(t)
	img := dockerBuild(t)
	checkStatic(t, img.binary)
	df := img.df

	// The builder is the Go release go.mod asks for.
	gomod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	if builder := df.stage("build").from; goLine == nil || !strings.HasPrefix(builder, "golang:"+string(goLine[1])+"-") {
		t.Errorf("build stage FROM %s, want golang:%s-… (go.mod's go line)", builder, goLine[1])
	}

	fin := df.final()
	if fin.from != "scratch" {
		t.Fatalf("final stage FROM %s: the test's empty root stands for scratch only", fin.from)
	}
	user := fin.one(t, "USER").args
	uid, gid := parseUser(t, user)
	if uid == 0 || gid == 0 {
		t.Fatalf("USER %s: want an unprivileged user", user)
	}

	// The root directory: the final stage's files.
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	var binInImage string
	for _, in := range fin.all("COPY") {
		f := strings.Fields(in.args)
		from, chown := "", ""
		for len(f) > 0 && strings.HasPrefix(f[0], "--") {
			switch k, v, _ := strings.Cut(f[0], "="); k {
			case "--from":
				from = v
			case "--chown":
				chown = v
			default:
				t.Fatalf("Dockerfile:%d: COPY %s: unknown option", in.line, f[0])
			}
			f = f[1:]
		}
		if from != "build" || len(f) != 2 {
			t.Fatalf("Dockerfile:%d: COPY %s: want --from=build src dst", in.line, in.args)
		}
		src, dst := f[0], filepath.Join(root, f[1])
		switch {
		case src == img.outDir:
			binInImage = f[1]
			copyFile(t, img.binary, dst, 0o755)
		case img.dirs[src]:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			if chown != "" {
				u, g := parseUser(t, chown)
				if err := os.Chown(dst, u, g); err != nil {
					t.Fatal(err)
				}
			}
		case src == "/etc/ssl/certs/ca-certificates.crt":
			// Only for TLS to Redis, PostgreSQL, NATS or Kafka: left out to
			// show the node needs nothing else.
		default:
			t.Fatalf("Dockerfile:%d: COPY %s: the test does not know this file; teach it", in.line, in.args)
		}
	}
	entry := execForm(t, fin.one(t, "ENTRYPOINT"))
	args := execForm(t, fin.one(t, "CMD"))
	if binInImage == "" || len(entry) == 0 || entry[0] != binInImage {
		t.Fatalf("ENTRYPOINT %q does not run the copied binary %q", entry, binInImage)
	}
	dataDir := flagValue(args, "data")
	volumes := strings.Fields(strings.Trim(fin.one(t, "VOLUME").args, "[]"))
	if dataDir == "" || len(volumes) != 1 || strings.Trim(volumes[0], `",`) != dataDir {
		t.Errorf("VOLUME %v, CMD -data %q: want the volume to be the data directory", volumes, dataDir)
	}
	if fi, err := os.Stat(filepath.Join(root, dataDir)); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(uid) {
		t.Fatalf("%s in the image: %v, want a directory owned by the USER %d", dataDir, err, uid)
	}
	// EXPOSE names the ports of -addr and -health-addr.
	exposed := strings.Fields(fin.one(t, "EXPOSE").args)
	_, clientPort, _ := net.SplitHostPort(flagValue(args, "addr"))
	_, healthPort, _ := net.SplitHostPort(flagValue(args, "health-addr"))
	if strings.Join(exposed, " ") != clientPort+" "+healthPort {
		t.Errorf("EXPOSE %v, want the ports of -addr and -health-addr: %s %s", exposed, clientPort, healthPort)
	}

	// Run it as the image would, listening on free ports instead of the
	// CMD's (as docker run -p maps them; flags given later win).
	argv := append(append(append([]string{}, entry...), args...), "-addr=127.0.0.1:0", "-health-addr=127.0.0.1:0")
	n := startNode(t, chrooted(root, uid, gid, argv), true)
	waitReady(t, n, n.addr)
	for _, addr := range []string{n.addr, n.health} {
		for _, path := range []string{"/healthz", "/readyz"} {
			if code, body := get(t, addr, path, ""); code != http.StatusOK {
				t.Errorf("%s on %s: %d %s", path, addr, code, body)
			}
		}
	}
	// Its data: under the volume, owned by the user.
	for _, name := range []string{"presenced.db", "api-key", "jwt-secret"} {
		fi, err := os.Stat(filepath.Join(root, dataDir, name))
		if err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(uid) {
			t.Errorf("%s/%s: %v, want a file owned by %d", dataDir, name, err, uid)
		}
	}
	entries, _ := os.ReadDir(root)
	var top []string
	for _, e := range entries {
		top = append(top, e.Name())
	}
	if want := []string{strings.TrimPrefix(dataDir, "/"), strings.TrimPrefix(binInImage, "/")}; strings.Join(top, " ") != strings.Join(want, " ") {
		t.Errorf("the root holds %q after the start, want only %q: the node wrote outside its volume", top, want)
	}
	key, err := os.ReadFile(filepath.Join(root, dataDir, "api-key"))
	if err != nil {
		t.Fatal(err)
	}
	apiKey := strings.TrimSpace(string(key))
	if code, body := do(t, "POST", n.addr, "/v1/heartbeat", apiKey, `{"user_id":"alice","device_id":"d1"}`); code != http.StatusOK {
		t.Fatalf("heartbeat: %d %s", code, body)
	}
	if code, body := get(t, n.addr, "/v1/presence/alice", apiKey); code != http.StatusOK || !strings.Contains(body, `"online"`) {
		t.Errorf("alice after a heartbeat: %d %s, want online", code, body)
	}
	if code, body := get(t, n.health, "/metrics", apiKey); code != http.StatusOK || !strings.Contains(body, "presenced_build_info{") {
		t.Errorf("/metrics on the health port: %d, want 200 with presenced_build_info", code)
	}

	// HEALTHCHECK: its command, against the health port it names.
	hc := fin.one(t, "HEALTHCHECK").args
	i := strings.Index(hc, "CMD ")
	if i < 0 {
		t.Fatalf("HEALTHCHECK %s: no CMD", hc)
	}
	check := execForm(t, instr{cmd: "HEALTHCHECK CMD", args: hc[i+4:]})
	if len(check) != 3 || check[0] != binInImage || check[1] != "-healthcheck" {
		t.Fatalf("HEALTHCHECK CMD %q: want %s -healthcheck URL", check, binInImage)
	}
	u, err := url.Parse(check[2])
	if err != nil || u.Hostname() != "127.0.0.1" || u.Port() != healthPort || u.Path != "/healthz" {
		t.Fatalf("HEALTHCHECK URL %s: want http://127.0.0.1:%s/healthz (-health-addr's port)", check[2], healthPort)
	}
	_, actual, _ := net.SplitHostPort(n.health)
	u.Host = "127.0.0.1:" + actual
	check[2] = u.String()
	if out, err := chrooted(root, uid, gid, check).CombinedOutput(); err != nil {
		t.Errorf("HEALTHCHECK %q on a serving node: %v\n%s", check, err, out)
	}

	n.stop(t)
	if !strings.Contains(n.logs.String(), `"msg":"presenced stopped"`) {
		t.Errorf("no JSON \"presenced stopped\" line:\n%s", n.logs)
	}
	if out, err := chrooted(root, uid, gid, check).CombinedOutput(); err == nil {
		t.Errorf("HEALTHCHECK %q succeeded on a stopped node:\n%s", check, out)
	}
}

// chrooted is argv run with root as its root directory, as uid:gid, in
// an empty environment (the final stage sets no ENV).
func chrooted(root string, uid, gid int, argv []string) *exec.Cmd {
	cmd := &exec.Cmd{Path: argv[0], Args: argv, Dir: "/", Env: []string{}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:     root,
		Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}},
	}
	return cmd
}

func parseUser(t *testing.T, s string) (uid, gid int) {
	t.Helper()
	u, g, ok := strings.Cut(s, ":")
	var err1, err2 error
	uid, err1 = strconv.Atoi(u)
	gid, err2 = strconv.Atoi(g)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("user %q: want numeric uid:gid (the image has no /etc/passwd)", s)
	}
	return uid, gid
}

// flagValue returns the value of -name=value in args ("" if absent).
func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "-"+name+"="); ok {
			return v
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, mode); err != nil {
		t.Fatal(err)
	}
}

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestNPMPackage checks js/presence as the npm package @presenced/presence:
//
//   - npm pack makes a tarball of exactly the client, its timer worker, the
//     declarations, the README, the licence and package.json;
//   - tsc: presence.js passes --checkJs --strict, and presence.d.ts states
//     what its JSDoc types state (js/presence/test/conformance.ts), so a
//     declaration the code does not bear out fails;
//   - the tarball installs offline into an empty directory, where a typed
//     use of the package by its name compiles under --strict (module
//     resolution nodenext and bundler) and every mistake in it is refused
//     (js/presence/test/usage.ts);
//   - Node imports the installed package by its name, finds its exports,
//     and connects to a real presenced: a watcher sees a change, a token
//     function renews expiring tokens unseen, a room's watcher sees joins
//     and leaves but nothing of a socket back within the close grace, and
//     a room of more than 10 members goes into interval mode and back
//     (js/presence/test/installed.mjs);
//   - the binary serves at /static/presence.js the very bytes installed.
//
// Without node, npm or typescript (npm ci in the repository root) it fails
// under CI=true (scripts/test.sh installs them) and skips elsewhere.
func TestNPMPackage(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	node, npm, tsc := npmTools(t, root)
	pkgDir := filepath.Join(root, "js", "presence")
	tmp := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// npm pack, into tmp.
	out := run(ctx, t, pkgDir, npm, "pack", "--json", "--ignore-scripts", "--pack-destination", tmp)
	var packed []struct {
		Filename string
		Files    []struct{ Path string }
	}
	if err := json.Unmarshal(out, &packed); err != nil || len(packed) != 1 {
		t.Fatalf("npm pack --json: %v\n%s", err, out)
	}
	var files []string
	for _, f := range packed[0].Files {
		files = append(files, f.Path)
	}
	slices.Sort(files)
	if want := []string{"LICENSE", "README.md", "package.json", "presence-timer.js", "presence.d.ts", "presence.js"}; !slices.Equal(files, want) {
		t.Errorf("npm pack holds %q, want %q", files, want)
	}
	tarball := filepath.Join(tmp, packed[0].Filename)

	// tsc over the code and the declarations, in the layout conformance.ts
	// describes.
	conf := filepath.Join(tmp, "conformance")
	copyFile(t, filepath.Join(pkgDir, "presence.js"), filepath.Join(conf, "impl", "presence.js"))
	copyFile(t, filepath.Join(pkgDir, "presence.d.ts"), filepath.Join(conf, "decl", "presence.d.ts"))
	copyFile(t, filepath.Join(pkgDir, "test", "conformance.ts"), filepath.Join(conf, "conformance.ts"))
	writeFile(t, filepath.Join(conf, "package.json"), `{"type": "module"}`)
	tscFlags := []string{"--noEmit", "--strict", "--target", "es2022", "--lib", "es2022,dom"}
	run(ctx, t, conf, node, append([]string{tsc, "--allowJs", "--checkJs", "--module", "nodenext"}, append(tscFlags, "conformance.ts")...)...)
	// The timer worker runs in a worker's scope.
	run(ctx, t, pkgDir, node, tsc, "--allowJs", "--checkJs", "--noEmit", "--strict", "--target", "es2022",
		"--module", "nodenext", "--lib", "es2022,webworker", "presence-timer.js")

	// Install the tarball into an empty directory, offline (the package has
	// no dependencies), with a cache of its own.
	app := filepath.Join(tmp, "app")
	writeFile(t, filepath.Join(app, "package.json"), `{"name": "npm-check", "private": true, "type": "module"}`)
	run(ctx, t, app, npm, "install", "--offline", "--ignore-scripts", "--no-audit", "--no-fund",
		"--cache", filepath.Join(tmp, "npm-cache"), tarball)
	installed := filepath.Join(app, "node_modules", "@presenced", "presence")
	for _, name := range []string{"presence.js", "presence-timer.js", "presence.d.ts"} {
		if !bytes.Equal(readFile(t, filepath.Join(installed, name)), readFile(t, filepath.Join(pkgDir, name))) {
			t.Errorf("the installed %s differs from js/presence/%s", name, name)
		}
	}

	// The typed use, by the package's name.
	copyFile(t, filepath.Join(pkgDir, "test", "usage.ts"), filepath.Join(app, "usage.ts"))
	run(ctx, t, app, node, append([]string{tsc, "--module", "nodenext"}, append(tscFlags, "usage.ts")...)...)
	run(ctx, t, app, node, append([]string{tsc, "--module", "esnext", "--moduleResolution", "bundler"}, append(tscFlags, "usage.ts")...)...)

	// A real node, whose rooms go into interval mode above 10 members, and
	// a backend that mints its tokens.
	srv := startServer(t, root, tmp, "-room-interval-above", "10", "-room-interval", "200ms")
	control := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/token" {
			http.NotFound(w, r)
			return
		}
		tok, err := mint(srv.data, r.URL.Query().Get("user"), r.URL.Query().Get("ttl"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintln(w, tok)
	}))
	defer control.Close()
	base := "http://" + srv.address()

	// One source: the binary serves the bytes the package installs.
	for _, name := range []string{"presence.js", "presence-timer.js"} {
		resp, err := http.Get(base + "/static/" + name)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, readFile(t, filepath.Join(installed, name))) {
			t.Errorf("GET /static/%s: %d, %d bytes (%v); want 200 and the installed package's file", name, resp.StatusCode, len(body), err)
		}
	}

	// Node imports the installed package by its name.
	copyFile(t, filepath.Join(pkgDir, "test", "installed.mjs"), filepath.Join(app, "installed.mjs"))
	args := []string{"--test-reporter=spec", "installed.mjs"}
	if strings.TrimSpace(string(run(ctx, t, app, node, "-p", "typeof WebSocket"))) != "function" {
		args = append([]string{"--experimental-websocket"}, args...) // node 20
	}
	nodeTest(ctx, t, app, node, args, "PRESENCED_URL="+base, "PRESENCED_CONTROL="+control.URL)
	// Without a global WebSocket (as on Node 20 without the flag): a clear
	// error, and the ws package's WebSocket passed instead.
	copyFile(t, filepath.Join(pkgDir, "test", "nowebsocket.mjs"), filepath.Join(app, "nowebsocket.mjs"))
	nodeTest(ctx, t, app, node, []string{"--test-reporter=spec", "nowebsocket.mjs"},
		"PRESENCED_URL="+base, "WS_MODULE="+filepath.Join(root, "node_modules", "ws", "wrapper.mjs"))
	if err := srv.stop(); err != nil {
		t.Errorf("presenced did not stop cleanly: %v", err)
	}
	if logs := srv.logs.String(); strings.Contains(logs, "DATA RACE") || strings.Contains(logs, "panic") {
		t.Errorf("presenced reported a data race or a panic")
	}
}

// npmTools finds node, npm and the repository's typescript, or ends the test.
func npmTools(t *testing.T, root string) (node, npm, tsc string) {
	t.Helper()
	var missing []string
	node, err := exec.LookPath("node")
	if err != nil {
		missing = append(missing, "node (Debian: apt-get install nodejs)")
	}
	npm, err = exec.LookPath("npm")
	if err != nil {
		missing = append(missing, "npm (Debian: apt-get install npm)")
	}
	tsc = filepath.Join(root, "node_modules", "typescript", "bin", "tsc")
	if _, err := os.Stat(tsc); err != nil {
		missing = append(missing, "typescript (npm ci in the repository root)")
	}
	if _, err := os.Stat(filepath.Join(root, "node_modules", "ws", "wrapper.mjs")); err != nil {
		missing = append(missing, "ws (npm ci in the repository root)")
	}
	if len(missing) == 0 {
		return node, npm, tsc
	}
	msg := "the npm package test needs " + strings.Join(missing, ", ") + "; ./scripts/test.sh installs them"
	if os.Getenv("CI") == "true" && !testing.Short() {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return "", "", ""
}

// run runs name with args in dir and returns its standard output; it ends
// the test with the output when the command fails.
func run(ctx context.Context, t *testing.T, dir, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s%s", filepath.Base(name), strings.Join(args, " "), dir, err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes()
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	writeFile(t, to, string(readFile(t, from)))
}

// nodeTest runs node with args in dir, its test script's output logged
// line by line, with env added to this process's (NODE_OPTIONS cleared);
// a failure fails t and the test goes on.
func nodeTest(ctx context.Context, t *testing.T, dir, node string, args []string, env ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, node, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), env...), "NODE_OPTIONS=")
	lines := &lineLogger{t: t, prefix: "node: "}
	cmd.Stdout, cmd.Stderr = lines, lines
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	lines.Flush()
	if err != nil {
		t.Errorf("node %s: %v", args[len(args)-1], err)
	}
}

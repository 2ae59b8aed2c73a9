package deploy

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// binaryFlags lists the flags of the built binary, from its -h, and the
// rule by which it names their environment variables (also from -h).
func binaryFlags(t *testing.T, bin string) (flags map[string]bool, envFlag func(env string) (string, bool)) {
	t.Helper()
	out, _ := exec.Command(bin, "-h").CombinedOutput() // -h exits 0 or 2 by Go's flag package's mood; the text is what counts
	flags = map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllSubmatch(out, -1) {
		flags[string(m[1])] = true
	}
	if len(flags) < 20 {
		t.Fatalf("%s -h lists %d flags:\n%s", bin, len(flags), out)
	}
	ex := regexp.MustCompile(`e\.g\. -([a-z0-9-]+) by ([A-Z0-9_]+)\.`).FindSubmatch(out)
	if ex == nil {
		t.Fatalf("%s -h does not say how flags are named in the environment:\n%s", bin, out)
	}
	upper := func(flag string) string { return strings.ToUpper(strings.ReplaceAll(flag, "-", "_")) }
	prefix, ok := strings.CutSuffix(string(ex[2]), upper(string(ex[1])))
	if !ok || prefix == "" {
		t.Fatalf("cannot derive the environment's prefix from %q", ex[0])
	}
	return flags, func(env string) (string, bool) {
		rest, ok := strings.CutPrefix(env, prefix)
		if !ok {
			return "", false
		}
		f := strings.ToLower(strings.ReplaceAll(rest, "_", "-"))
		return f, flags[f] && upper(f) == rest
	}
}

// runtimeEnv are the variables the Go runtime itself reads, which the
// manifests may set.
var runtimeEnv = map[string]bool{"GOMEMLIMIT": true, "GOMAXPROCS": true, "GOGC": true}

// deployFiles are the deployment files of this directory.
func deployFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"Dockerfile", "presenced.service"}
	n := len(files)
	err := filepath.WalkDir("kustomize", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".example")) {
			files = append(files, path)
		}
		return err
	})
	if err != nil || len(files) == n {
		t.Fatalf("no kustomize/**/*.yaml: %v", err)
	}
	return files
}

// TestNamesExist: every PRESENCE_* variable and every -flag written in the
// deployment files (comments included: they are instructions too) is one
// the binary has. The tests of each file then start the binary with its
// flags and environment, so a value it refuses fails there.
func TestNamesExist(t *testing.T) {
	img := dockerBuild(t)
	flags, envFlag := binaryFlags(t, img.binary)
	envRE := regexp.MustCompile(`\bPRESENCE_[A-Z0-9_]+\b`)
	// A flag as the files write it: -name=value, or -name followed by a
	// space in a command line; only after a blank, [ or " so that words
	// like "scale-out" are not taken for flags.
	flagRE := regexp.MustCompile(`(?:^|[\s\["])-([a-z][a-z0-9-]*)(?:=|"|\s|$)`)
	seenEnv, seenFlags := 0, 0
	for _, path := range deployFiles(t) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, env := range envRE.FindAllString(string(b), -1) {
			seenEnv++
			if _, ok := envFlag(env); !ok {
				t.Errorf("%s names %s: the binary has no flag it sets", path, env)
			}
		}
		for _, line := range strings.Split(string(b), "\n") {
			for _, m := range flagRE.FindAllStringSubmatch(line, -1) {
				name := m[1]
				if isCommandOption(line) {
					continue
				}
				seenFlags++
				if !flags[name] {
					t.Errorf("%s: %q names -%s: the binary has no such flag", path, strings.TrimSpace(line), name)
				}
			}
		}
	}
	if seenEnv < 5 || seenFlags < 10 {
		t.Errorf("found only %d environment variables and %d flags in the files: is the scan broken?", seenEnv, seenFlags)
	}
}

// isCommandOption says the flags on line belong to another program than
// presenced: install -m, mkdir -p, openssl rand -hex, docker, go build.
func isCommandOption(line string) bool {
	for _, other := range []string{"install -m", "mkdir -p", "rand -hex", "--from-literal", "docker ", "systemctl ", "kubectl ", "-buildvcs", "go build", "-trimpath", "-ldflags"} {
		if strings.Contains(line, other) && !strings.Contains(line, "presenced -") {
			return true
		}
	}
	return false
}

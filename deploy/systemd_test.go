package deploy

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// unitFile is a systemd unit: section → key → values in order (a key may
// repeat).
type unitFile map[string]map[string][]string

func parseUnit(t *testing.T, path string) unitFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unitFile{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			u[section] = map[string][]string{}
		case section == "":
			t.Fatalf("%s:%d: %q outside a section", path, n, line)
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || strings.HasSuffix(line, `\`) {
				t.Fatalf("%s:%d: %q: want key=value on one line", path, n, line)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

func (u unitFile) get(section, key string) string {
	v := u[section][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// TestSystemdUnit checks deploy/presenced.service: the options the
// deployment relies on are there, `systemd-analyze verify` finds nothing
// to say about it (an unknown key or a bad value is only a warning there,
// so any output fails), `systemd-analyze security` rates its sandbox, and
// the binary starts with its ExecStart's flags and serves its probes.
func TestSystemdUnit(t *testing.T) {
	img := dockerBuild(t)
	const path = "presenced.service"
	u := parseUnit(t, path)
	svc := u["Service"]
	if svc == nil {
		t.Fatal("no [Service] section")
	}
	for key, want := range map[string]string{
		"Restart":         "on-failure",
		"ProtectSystem":   "strict",
		"ProtectHome":     "yes",
		"PrivateTmp":      "yes",
		"NoNewPrivileges": "yes",
		"DynamicUser":     "yes",
		"StateDirectory":  "presenced",
	} {
		if got := u.get("Service", key); got != want {
			t.Errorf("%s=%q, want %q", key, got, want)
		}
	}
	if n, err := strconv.Atoi(u.get("Service", "LimitNOFILE")); err != nil || n < 65536 {
		t.Errorf("LimitNOFILE=%q: want a number of at least 65536 (a descriptor per connection)", u.get("Service", "LimitNOFILE"))
	}
	if !strings.Contains(strings.Join(svc["SystemCallFilter"], " "), "@system-service") {
		t.Errorf("SystemCallFilter=%q: want @system-service", svc["SystemCallFilter"])
	}
	if got := u.get("Service", "RestrictAddressFamilies"); got != "AF_INET AF_INET6 AF_UNIX" {
		t.Errorf("RestrictAddressFamilies=%q", got)
	}
	if len(svc["ExecStart"]) != 1 {
		t.Fatalf("ExecStart: %q, want one", svc["ExecStart"])
	}
	argv, err := shellWords(svc["ExecStart"][0])
	if err != nil || len(argv) < 2 || !filepath.IsAbs(argv[0]) {
		t.Fatalf("ExecStart=%s: %v; want an absolute path and flags", svc["ExecStart"][0], err)
	}
	if d := flagValue(argv[1:], "data"); d != "/var/lib/"+u.get("Service", "StateDirectory") {
		t.Errorf("-data=%q, want the StateDirectory /var/lib/%s", d, u.get("Service", "StateDirectory"))
	}
	for _, f := range []string{"addr", "health-addr"} {
		if flagValue(argv[1:], f) == "" {
			t.Errorf("ExecStart has no -%s=…", f)
		}
	}

	t.Run("systemd-analyze", func(t *testing.T) {
		analyze, err := exec.LookPath("systemd-analyze")
		if err != nil {
			// scripts/test.sh installs Debian's systemd package for it.
			msg := fmt.Sprintf("systemd-analyze is not installed (Debian package systemd): %v", err)
			if testing.Short() {
				t.Skip("skipped under -short (without -short this fails): " + msg)
			}
			t.Fatal(msg)
		}
		// verify checks that ExecStart's program exists: the copy names the
		// binary the Dockerfile's build made, and is otherwise the file.
		dir := t.TempDir()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		unit := strings.Replace(string(b), "ExecStart="+argv[0]+" ", "ExecStart="+img.binary+" ", 1)
		if unit == string(b) {
			t.Fatal("could not point ExecStart at the built binary")
		}
		copyPath := filepath.Join(dir, "presenced.service")
		if err := os.WriteFile(copyPath, []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", "--man=no", copyPath).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
		out, err = exec.Command(analyze, "security", "--offline=yes", copyPath).CombinedOutput()
		m := regexp.MustCompile(`Overall exposure level for presenced\.service: ([0-9.]+)`).FindSubmatch(out)
		if err != nil || m == nil {
			t.Fatalf("systemd-analyze security --offline=yes: %v\n%s", err, out)
		}
		// 0 is a perfect sandbox, 10 none; systemd calls up to 2.0 "OK".
		if level, _ := strconv.ParseFloat(string(m[1]), 64); level > 2.0 {
			t.Errorf("exposure level %s, want at most 2.0:\n%s", m[1], out)
		}
	})

	t.Run("ExecStart", func(t *testing.T) {
		// The unit's flags, then free ports and a temporary state directory
		// (later flags win).
		args := append(append([]string{}, argv[1:]...), "-addr=127.0.0.1:0", "-health-addr=127.0.0.1:0", "-data="+t.TempDir())
		n := startNode(t, exec.Command(img.binary, args...), true)
		waitReady(t, n, n.health)
		for _, p := range []string{"/healthz", "/readyz"} {
			if code, body := get(t, n.health, p, ""); code != http.StatusOK {
				t.Errorf("%s on the health address: %d %s", p, code, body)
			}
		}
		n.stop(t)
	})
}

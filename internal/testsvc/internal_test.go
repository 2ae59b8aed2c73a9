package testsvc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMissingBinaryNamesThePackage(t *testing.T) {
	_, err := findBinary("presenced-no-such-server", "presenced-pkg", t.TempDir())
	if err == nil {
		t.Fatal("found a binary that does not exist")
	}
	for _, want := range []string{"presenced-no-such-server", `"presenced-pkg"`, "apt-get install -y presenced-pkg", "scripts/test.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestSweepRemovesDeadBinariesDirectories(t *testing.T) {
	// A pid that has exited: a process of our own, waited for.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead, err := os.MkdirTemp(tempRoot(), "presenced-testsvc-sweeptest-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dead)
	os.WriteFile(filepath.Join(dead, ownerFile), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
	alive, err := os.MkdirTemp(tempRoot(), "presenced-testsvc-sweeptest-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(alive)
	if err := markOwner(alive); err != nil {
		t.Fatal(err)
	}

	sweep()
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("directory of a dead binary still there (%v)", err)
	}
	if _, err := os.Stat(alive); err != nil {
		t.Errorf("directory of a live binary swept: %v", err)
	}
}

// TestPostgresKillAndPauseTakeTheBackends: PostgreSQL's backends start
// sessions of their own, outside the postmaster's process group; Kill and
// Pause must reach them too.
func TestPostgresKillAndPauseTakeTheBackends(t *testing.T) {
	t.Parallel()
	s := Postgres(t)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var backend int
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		t.Fatal(err)
	}

	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	qctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	var one int
	err = c.QueryRow(qctx, "SELECT 1").Scan(&one)
	cancel()
	if err == nil {
		t.Fatal("a paused server's backend answered")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	c2, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatalf("after Resume: %v", err)
	}
	c2.Close(ctx)

	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(backend, 0); !errors.Is(err, syscall.ESRCH) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", backend))
		t.Errorf("backend %d still there after Kill (%v): %s", backend, err, b)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
}

// recordTB records what Fatal makes of an error instead of ending a test.
type recordTB struct {
	testing.TB
	skipped, failed string
}

func (r *recordTB) Helper()                     {}
func (r *recordTB) Skipf(f string, args ...any) { r.skipped = fmt.Sprintf(f, args...) }
func (r *recordTB) Fatal(args ...any)           { r.failed = fmt.Sprint(args...) }

// A server that is not installed fails a test, except under -short, where
// it skips it saying why; any other error fails it always.
func TestFatalSkipsOnlyAMissingServerUnderShort(t *testing.T) {
	_, missing := findBinary("presenced-no-such-server", "presenced-pkg", t.TempDir())
	other := fmt.Errorf("testsvc: redis on 127.0.0.1:1 %w", errExited)
	for _, c := range []struct {
		name  string
		err   error
		short bool
		skip  bool
	}{
		{"missing, full suite", missing, false, false},
		{"missing, -short", missing, true, true},
		{"wrapped missing, -short", fmt.Errorf("cluster node: %w", missing), true, true},
		{"other, full suite", other, false, false},
		{"other, -short", other, true, false},
	} {
		var r recordTB
		fatal(&r, c.err, c.short)
		if c.skip {
			if r.failed != "" || !strings.Contains(r.skipped, "-short") || !strings.Contains(r.skipped, "presenced-no-such-server") {
				t.Errorf("%s: failed %q, skipped %q; want skipped, naming -short and the binary", c.name, r.failed, r.skipped)
			}
		} else if r.skipped != "" || r.failed != c.err.Error() {
			t.Errorf("%s: failed %q, skipped %q; want failed with %q", c.name, r.failed, r.skipped, c.err)
		}
	}
}

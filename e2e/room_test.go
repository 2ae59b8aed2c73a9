package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBrowserRoom runs e2e/room.mjs against a fresh presenced started with
// -dev and a close grace of 1 s: two people on the demo page see each
// other in its room, a reload shows no leave, and a closed tab leaves once
// the grace has run out; guests joining over HTTP take the room past
// -room-interval-above, and the page follows its interval messages. Like
// TestBrowser it fails without its tools under
// CI=true and skips elsewhere.
func TestBrowserRoom(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no browser")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	node, chromium := tools(t, root)
	tmp := t.TempDir()
	const grace = time.Second
	const intervalAbove = 10
	srv := startServer(t, root, tmp, "-close-grace", grace.String(),
		"-room-interval-above", strconv.Itoa(intervalAbove), "-room-interval", "300ms")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := os.Getenv("PRESENCED_E2E_OUT")
	if out == "" {
		out = tmp
	}
	cmd := exec.CommandContext(ctx, node, filepath.Join(root, "e2e", "room.mjs"), "http://"+srv.address(), out)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PRESENCED_CHROMIUM="+chromium, "PRESENCED_CLOSE_GRACE_MS="+strconv.FormatInt(grace.Milliseconds(), 10),
		"PRESENCED_ROOM_INTERVAL_ABOVE="+strconv.Itoa(intervalAbove))
	lines := &lineLogger{t: t, prefix: "browser: "}
	cmd.Stdout, cmd.Stderr = lines, lines
	cmd.WaitDelay = 5 * time.Second
	runErr := cmd.Run()
	lines.Flush()
	if runErr != nil {
		t.Errorf("browser room scenario failed: %v", runErr)
	}
	t.Logf("screenshot of ann's page: %s", filepath.Join(out, "room.png"))
	if err := srv.stop(); err != nil {
		t.Errorf("presenced did not stop cleanly: %v", err)
	}
	if logs := srv.logs.String(); strings.Contains(logs, "DATA RACE") || strings.Contains(logs, "panic") {
		t.Errorf("presenced reported a data race or a panic")
	}
}

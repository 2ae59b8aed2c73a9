package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestClientUnit runs the unit tests of presence.js (presence.test.mjs:
// versions, re-subscribe, rooms, heartbeat jitter, backoff, bye) under node's test
// runner, with a fake WebSocket and mocked timers.
func TestClientUnit(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		msg := "the client's unit tests need node (Debian: apt-get install nodejs); ./scripts/test.sh installs it"
		if os.Getenv("CI") == "true" && !testing.Short() {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", filepath.Join("e2e", "presence.test.mjs"))
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAdminPage runs e2e/admin.mjs against a fresh presenced: the
// operator page at /admin signed in with a wrong and then the node's API
// key, the node listed ready, the numbers and plots moving with a demo
// page's WebSocket, the user view explaining a user as another sees them.
// Like TestBrowser it fails under CI=true without node, playwright-core
// or chromium, and skips elsewhere. The screenshot it takes is the one in
// docs/img/admin.png (PRESENCED_E2E_OUT keeps it).
func TestAdminPage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no browser")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	node, chromium := tools(t, root)

	tmp := t.TempDir()
	srv := startServer(t, root, tmp)
	key, err := os.ReadFile(filepath.Join(srv.data, "api-key"))
	if err != nil {
		t.Fatalf("the API key presenced generated: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	out := os.Getenv("PRESENCED_E2E_OUT")
	if out == "" {
		out = tmp
	}
	cmd := exec.CommandContext(ctx, node, filepath.Join(root, "e2e", "admin.mjs"), "http://"+srv.address(), out)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PRESENCED_CHROMIUM="+chromium, "PRESENCED_API_KEY="+string(bytes.TrimSpace(key)))
	lines := &lineLogger{t: t, prefix: "admin: "}
	cmd.Stdout, cmd.Stderr = lines, lines
	cmd.WaitDelay = 5 * time.Second
	runErr := cmd.Run()
	lines.Flush()
	if runErr != nil {
		t.Errorf("operator page scenario failed: %v", runErr)
	} else {
		t.Logf("screenshot of the operator page: %s", filepath.Join(out, "admin.png"))
	}
	if err := srv.stop(); err != nil {
		t.Errorf("presenced did not stop cleanly: %v", err)
	}
	logs := srv.logs.String()
	if strings.Contains(logs, "DATA RACE") || strings.Contains(logs, "panic") {
		t.Errorf("presenced reported a data race or a panic")
	}
	// The refused key reached the server as a refusal, never as a backend.
	if strings.Contains(logs, "not-the-api-key") {
		t.Errorf("presenced logged the key a user typed")
	}
}

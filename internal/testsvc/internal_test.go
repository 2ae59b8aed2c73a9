package testsvc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
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

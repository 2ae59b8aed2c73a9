//go:build linux

package connbudget

import (
	"os"
	"testing"
)

// ReserveFiles grows the descriptor table up front, and closes no
// descriptor in use.
func TestReserveFilesGrowsTheTable(t *testing.T) {
	before := fdSize()
	if before <= 0 {
		t.Fatalf("FDSize %d: /proc/self/status unreadable", before)
	}
	f, err := os.CreateTemp(t.TempDir(), "open")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := min(before*4, int(FileLimit()))
	if want <= before {
		t.Fatalf("file limit %d leaves no room above the table's %d", FileLimit(), before)
	}
	got, err := ReserveFiles(want)
	if err != nil {
		t.Fatal(err)
	}
	if got < want || fdSize() < want {
		t.Fatalf("table of %d (FDSize %d) after reserving %d (was %d)", got, fdSize(), want, before)
	}
	if _, err := f.WriteString("still open"); err != nil {
		t.Fatalf("a file open before the reserve: %v", err)
	}
	// Asking for less, or again, changes nothing.
	if again, err := ReserveFiles(want / 2); err != nil || again != got {
		t.Fatalf("ReserveFiles(%d) = %d, %v; want %d", want/2, again, err, got)
	}
}

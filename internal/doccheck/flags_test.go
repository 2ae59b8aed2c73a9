package doccheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// binaryFlags builds cmd/presenced and returns the names of the flags its
// -h prints.
func binaryFlags(t *testing.T, root string) []string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "presenced")
	build := exec.Command("go", "build", "-o", bin, "./cmd/presenced")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/presenced: %v\n%s", err, out)
	}
	// -h prints the usage and exits 0; its text is what a user reads.
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	re := regexp.MustCompile(`(?m)^  -([a-z][a-z0-9-]*)`)
	var flags []string
	for _, m := range re.FindAllStringSubmatch(string(out), -1) {
		flags = append(flags, m[1])
	}
	if len(flags) < 10 {
		t.Fatalf("presenced -h printed %d flags: is its format what this test reads?\n%s", len(flags), out)
	}
	return flags
}

// docFlags returns the flags named in the first cell of the rows of the
// table whose header's first cell is "flag" in path, with the line of each.
func docFlags(t *testing.T, path string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("`-([a-z][a-z0-9-]*)")
	flags := map[string]int{}
	in := false
	for i, line := range strings.Split(string(b), "\n") {
		cells := splitRow(line)
		switch {
		case len(cells) > 1 && cells[0] == "flag":
			in = true
			continue
		case !in:
			continue
		case len(cells) == 0:
			in = false
			continue
		}
		for _, m := range re.FindAllStringSubmatch(cells[0], -1) {
			flags[m[1]] = i + 1
		}
	}
	return flags
}

// TestFlagsDocumented: the flag table of docs/configuration.md names every
// flag of the binary, and no flag the binary does not have.
func TestFlagsDocumented(t *testing.T) {
	root := moduleRoot(t)
	doc := filepath.Join(root, "docs", "configuration.md")
	have := binaryFlags(t, root)
	documented := docFlags(t, doc)
	for _, f := range have {
		if _, ok := documented[f]; !ok {
			t.Errorf("docs/configuration.md: the flag table has no row for -%s (presenced -h lists it): add one", f)
		}
	}
	for f, line := range documented {
		if !slices.Contains(have, f) {
			t.Errorf("docs/configuration.md:%d: the flag table names -%s, which presenced -h does not list: remove or rename it", line, f)
		}
	}
}

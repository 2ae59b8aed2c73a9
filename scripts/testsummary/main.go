// Command testsummary reads `go test -json` from standard input, prints
// what `go test` prints without -v (a line per package, the output of
// tests that failed), and ends with how many tests passed, failed and were
// skipped — naming each skipped test and why. It exits 1 if anything
// failed, so a script can use it in place of go test's own exit code.
//
//	go test -json ./... | go run ./scripts/testsummary
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

func main() {
	var (
		passed, failed int
		skipped        []string
		failedPkg      bool
		output         = map[string][]string{} // package/test → its output lines
	)
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 16<<20)
	for in.Scan() {
		var ev event
		if err := json.Unmarshal(in.Bytes(), &ev); err != nil {
			fmt.Println(in.Text()) // not JSON: a build error, say
			continue
		}
		key := ev.Package + " " + ev.Test
		switch ev.Action {
		case "build-output":
			fmt.Print(ev.Output)
		case "output":
			output[key] = append(output[key], ev.Output)
		case "pass":
			if ev.Test != "" {
				if !strings.Contains(ev.Test, "/") {
					passed++
				}
			} else {
				fmt.Printf("ok  \t%s\t%.3fs\n", ev.Package, ev.Elapsed)
			}
			delete(output, key)
		case "skip":
			if ev.Test != "" {
				why := ""
				for _, l := range output[key] {
					if s := strings.TrimSpace(l); strings.Contains(s, ".go:") {
						why = s
					}
				}
				skipped = append(skipped, fmt.Sprintf("%s %s: %s", ev.Package, ev.Test, why))
			} else {
				fmt.Printf("?   \t%s\t[no test files]\n", ev.Package)
			}
			delete(output, key)
		case "fail":
			if ev.Test != "" {
				if !strings.Contains(ev.Test, "/") {
					failed++
				}
				fmt.Print(strings.Join(output[key], ""))
			} else {
				failedPkg = true
				out := strings.Join(output[key], "") // ends with go test's own FAIL line
				if !strings.Contains(out, "FAIL\t"+ev.Package) {
					out += fmt.Sprintf("FAIL\t%s\t%.3fs\n", ev.Package, ev.Elapsed)
				}
				fmt.Print(out)
			}
			delete(output, key)
		}
	}
	sort.Strings(skipped)
	fmt.Printf("\n== %d tests passed, %d failed (subtests not counted); %d tests or subtests skipped\n", passed, failed, len(skipped))
	for _, s := range skipped {
		fmt.Println("   skipped:", s)
	}
	if failed > 0 || failedPkg {
		os.Exit(1)
	}
}

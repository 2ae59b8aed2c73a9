package redisstore

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// TestScriptErrorNamesFileLines checks that every line of an assembled
// script maps back to the same text in its file of lua/.
func TestScriptErrorNamesFileLines(t *testing.T) {
	s, err := newScript(constants(30000, 300000, 32, 0, 600000, 5000, 256, 64), "packed", "beat_fast", "helpers", "beat")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(s.src, "\n")
	for n := 2; n <= len(lines)-1; n++ {
		where := s.where(n)
		file, ln, ok := strings.Cut(where, ":")
		if !ok || !strings.HasPrefix(file, "lua/") {
			t.Fatalf("line %d: mapped to %q, want lua/FILE:LINE", n, where)
		}
		src, err := luaFiles.ReadFile(file)
		if err != nil {
			t.Fatalf("line %d: %v", n, err)
		}
		i, _ := strconv.Atoi(ln)
		if got, want := strings.Split(string(src), "\n")[i-1], lines[n-1]; got != want {
			t.Fatalf("line %d mapped to %s = %q, want %q", n, where, got, want)
		}
	}
	if got := s.where(1); got != "(constants):1" {
		t.Errorf("line 1: got %q, want (constants):1", got)
	}
	// An error of Redis as it names lines (7.x: both forms in one message).
	base := errors.New("ERR user_script:40: attempt to compare nil with number script: 1f0c, on @user_script:40.")
	got := s.scriptError(base)
	if !errors.Is(got, base) {
		t.Errorf("scriptError does not wrap the original error")
	}
	want := s.where(40)
	if strings.Contains(got.Error(), "user_script") || strings.Count(got.Error(), want) != 2 {
		t.Errorf("scriptError: got %q, want both lines as %s", got, want)
	}
	if other := errors.New("READONLY You can't write against a read only replica."); s.scriptError(other) != other {
		t.Errorf("an error naming no script line was changed")
	}
}

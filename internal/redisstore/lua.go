package redisstore

import (
	"embed"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// The scripts live in lua/ as real files: helpers.lua holds the rules of
// presence.User shared by every operation, and each operation has its own
// file. A script sent to Redis is a line of constants (the store's rules),
// an optional fast path that runs before the helpers are defined
// (beat_fast.lua), the helpers and the operation's body. Redis names a
// line of the script it ran in its errors (user_script:N); scriptError
// turns that back into the file and line it came from.
//
//go:embed lua/*.lua
var luaFiles embed.FS

// luaScript is one operation's script and where each of its lines came
// from.
type luaScript struct {
	src   string
	parts []luaPart
}

// luaPart is a file's lines within a script: lines first … first+lines-1
// of the script are lines 1 … lines of file.
type luaPart struct {
	file         string
	first, lines int
}

// newScript assembles the script of one operation from the constants and
// the named files of lua/ (without ".lua"), in order.
func newScript(consts string, files ...string) (luaScript, error) {
	var b strings.Builder
	s := luaScript{}
	line := 1
	add := func(name, text string) {
		if !strings.HasSuffix(text, "\n") {
			text += "\n"
		}
		n := strings.Count(text, "\n")
		s.parts = append(s.parts, luaPart{file: name, first: line, lines: n})
		line += n
		b.WriteString(text)
	}
	add("(constants)", consts)
	for _, f := range files {
		src, err := luaFiles.ReadFile("lua/" + f + ".lua")
		if err != nil {
			return luaScript{}, fmt.Errorf("redisstore: script %s: %w", f, err)
		}
		add("lua/"+f+".lua", string(src))
	}
	s.src = b.String()
	return s, nil
}

// scriptLine matches the script lines Redis names in its errors:
// "user_script:12:" and "@user_script:12".
var scriptLine = regexp.MustCompile(`user_script:(\d+)`)

// where names the file and line of line n of the script.
func (s *luaScript) where(n int) string {
	for _, p := range s.parts {
		if n >= p.first && n < p.first+p.lines {
			return p.file + ":" + strconv.Itoa(n-p.first+1)
		}
	}
	return "user_script:" + strconv.Itoa(n)
}

// scriptError wraps err, an error of running s, with the file and line of
// lua/ that every script line it names came from.
func (s *luaScript) scriptError(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if !scriptLine.MatchString(msg) {
		return err
	}
	mapped := scriptLine.ReplaceAllStringFunc(msg, func(m string) string {
		n, _ := strconv.Atoi(strings.TrimPrefix(m, "user_script:"))
		return s.where(n)
	})
	return &luaError{msg: mapped, err: err}
}

// luaError is an error of a script with its lines named by file.
type luaError struct {
	msg string
	err error
}

func (e *luaError) Error() string { return e.msg }
func (e *luaError) Unwrap() error { return e.err }

// constants returns the first line of every script: the store's rules.
func constants(ttl, idle, maxDevices int64, floor uint64, evict, grace int64, shards, buckets int) string {
	return fmt.Sprintf("local TTL, IDLE, MAXDEV, FLOOR, EVICT, GRACE, SHARDS, BUCKETS = %d, %d, %d, %d, %d, %d, %d, %d\n",
		ttl, idle, maxDevices, floor, evict, grace, shards, buckets)
}

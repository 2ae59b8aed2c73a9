package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// sample is what the tool reads from the server at one moment.
type sample struct {
	At           time.Time `json:"at"`
	RSS          uint64    `json:"rss_bytes"`               // /proc/<pid>/status VmRSS
	Threads      uint64    `json:"threads"`                 // /proc/<pid>/status Threads
	CPU          float64   `json:"cpu_seconds"`             // /proc/<pid>/stat utime + stime
	HeapInuse    uint64    `json:"heap_inuse_bytes"`        // go_memstats_heap_inuse_bytes
	StackInuse   uint64    `json:"stack_inuse_bytes"`       // go_memstats_stack_inuse_bytes
	Sys          uint64    `json:"sys_bytes"`               // go_memstats_sys_bytes
	HeapIdle     uint64    `json:"heap_idle_bytes"`         // go_memstats_heap_idle_bytes
	HeapReleased uint64    `json:"heap_released_bytes"`     // go_memstats_heap_released_bytes (returned to the OS)
	Goroutines   uint64    `json:"goroutines"`              // go_goroutines
	OpenFDs      uint64    `json:"open_fds"`                // process_open_fds
	MaxFDs       uint64    `json:"max_fds"`                 // process_max_fds
	Metrics      bool      `json:"metrics"`                 // the /metrics figures were read
	MetricsErr   string    `json:"metrics_error,omitempty"` // why not
}

// server reads a presenced's memory.
type server struct {
	pid     int
	metrics string // http://host:port/metrics
	apiKey  string
	hc      *http.Client
}

func (s *server) sample() (sample, error) {
	smp := sample{At: time.Now()}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid))
	if err != nil {
		return smp, fmt.Errorf("server RSS: %w", err)
	}
	if smp.RSS, err = parseVmRSS(string(b)); err != nil {
		return smp, err
	}
	smp.Threads = parseThreads(string(b))
	if b, err = os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.pid)); err != nil {
		return smp, fmt.Errorf("server CPU: %w", err)
	}
	if smp.CPU, err = parseCPU(string(b)); err != nil {
		return smp, err
	}
	m, err := s.readMetrics()
	if err != nil {
		smp.MetricsErr = err.Error()
		return smp, nil
	}
	smp.Metrics = true
	smp.HeapInuse = uint64(m["go_memstats_heap_inuse_bytes"])
	smp.StackInuse = uint64(m["go_memstats_stack_inuse_bytes"])
	smp.Sys = uint64(m["go_memstats_sys_bytes"])
	smp.HeapIdle = uint64(m["go_memstats_heap_idle_bytes"])
	smp.HeapReleased = uint64(m["go_memstats_heap_released_bytes"])
	smp.Goroutines = uint64(m["go_goroutines"])
	smp.OpenFDs = uint64(m["process_open_fds"])
	smp.MaxFDs = uint64(m["process_max_fds"])
	return smp, nil
}

// readMetrics fetches /metrics and returns its unlabelled samples.
func (s *server) readMetrics() (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.metrics, nil)
	if err != nil {
		return nil, err
	}
	if s.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+s.apiKey)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return nil, fmt.Errorf("GET /metrics: %s %s (give -api-key)", resp.Status, strings.TrimSpace(string(b)))
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the Prometheus text format, keeping samples without
// labels.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := make(map[string]float64)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || strings.ContainsRune(line, '{') {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		out[f[0]] = v
	}
	return out, sc.Err()
}

// parseVmRSS is the VmRSS line of /proc/<pid>/status, in bytes.
func parseVmRSS(status string) (uint64, error) {
	for line := range strings.SplitSeq(status, "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("server RSS: odd line %q", line)
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("server RSS: %q: %v", line, err)
		}
		return kb << 10, nil
	}
	return 0, errors.New("server RSS: no VmRSS in /proc/<pid>/status")
}

// parseThreads is the Threads line of /proc/<pid>/status, 0 if absent.
func parseThreads(status string) uint64 {
	for line := range strings.SplitSeq(status, "\n") {
		if rest, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(rest), 10, 64)
			return n
		}
	}
	return 0
}

// parseCPU is the CPU time a process used, user and system, in seconds,
// from its /proc/<pid>/stat line (fields 14 and 15, in clock ticks of
// USER_HZ, 100 a second on Linux).
func parseCPU(stat string) (float64, error) {
	// The command name (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("server CPU: odd stat %q", stat)
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3
	if len(f) < 13 {
		return 0, fmt.Errorf("server CPU: odd stat %q", stat)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("server CPU: %v", err)
	}
	return float64(utime+stime) / 100, nil
}

// listeningPID finds the process that holds a listening TCP socket on port
// (IPv4 or IPv6), through /proc/net/tcp* and /proc/<pid>/fd.
func listeningPID(port int) (int, error) {
	inodes := make(map[string]bool)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, ino := range listenInodes(string(b), port) {
			inodes["socket:["+ino+"]"] = true
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("no process listens on port %d (give -server-pid)", port)
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*/fd")
	for _, d := range dirs {
		fds, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join(d, fd.Name())); err == nil && inodes[l] {
				return strconv.Atoi(filepath.Base(filepath.Dir(d)))
			}
		}
	}
	return 0, fmt.Errorf("the socket listening on port %d belongs to no process this user can see (give -server-pid)", port)
}

// listenInodes returns the inodes of the sockets of a /proc/net/tcp table
// that listen (state 0A) on port.
func listenInodes(table string, port int) []string {
	var out []string
	for i, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 10 || f[3] != "0A" {
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		pb, err := hex.DecodeString(hexPort)
		if err != nil || len(pb) != 2 || int(pb[0])<<8|int(pb[1]) != port {
			continue
		}
		out = append(out, f[9])
	}
	return out
}

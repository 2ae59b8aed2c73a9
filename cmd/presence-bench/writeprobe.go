package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The write probe: a process of its own that changes one user's status
// through POST /v1/status every -every, round-robin over -url, and
// prints each write as "SENT_UNIX_NS LATENCY_NS" (or "SENT_UNIX_NS -1
// ERROR") on its stdout. The storm runs one beside its 9,000 sockets: a
// client on a phone does not share a Go scheduler with the thousands of
// clients reconnecting elsewhere, and the tool's own POSTs do (its
// goroutines wait behind theirs for the tool's two threads).

type writeProbeConfig struct {
	urls   []string
	apiKey string
	user   string
	every  time.Duration
	dur    time.Duration
}

func parseWriteProbe(args []string, stderr io.Writer) (*writeProbeConfig, error) {
	fs := flag.NewFlagSet("write-probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c writeProbeConfig
	var urls string
	fs.StringVar(&urls, "url", "", "the nodes' HTTP bases (http://127.0.0.1:PORT), comma-separated")
	fs.StringVar(&c.apiKey, "api-key", "", "API key for POST /v1/status")
	fs.StringVar(&c.user, "user", "", "the user whose status changes")
	fs.DurationVar(&c.every, "every", 50*time.Millisecond, "time between two writes")
	fs.DurationVar(&c.dur, "for", time.Minute, "how long to write")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	c.apiKey = probeKey(c.apiKey)
	for u := range strings.SplitSeq(urls, ",") {
		if u = strings.TrimSpace(u); u != "" {
			c.urls = append(c.urls, u)
		}
	}
	switch {
	case len(c.urls) == 0 || c.apiKey == "" || c.user == "":
		return nil, errors.New("give -url, -api-key and -user")
	case c.every < time.Millisecond || c.dur <= 0 || c.dur > time.Hour:
		return nil, fmt.Errorf("-every %v, -for %v: want at least 1ms, and up to an hour", c.every, c.dur)
	}
	return &c, nil
}

func runWriteProbeCmd(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseWriteProbe(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "presence-bench: %v\n", err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.dur)
	defer cancel()
	writeProbe(ctx, cfg, stdout)
	return 0
}

// writeProbe writes until ctx ends, one write in flight, and prints each.
func writeProbe(ctx context.Context, cfg *writeProbeConfig, out io.Writer) {
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	w := bufio.NewWriter(out)
	defer w.Flush()
	next := time.Now()
	for k := 0; ; k++ {
		if !sleepUntil(ctx, next) {
			return
		}
		next = next.Add(cfg.every)
		status := "online"
		if k%2 == 0 {
			status = "busy"
		}
		body := []byte(`{"user_id":"` + cfg.user + `","status":"` + status + `"}`)
		sent := time.Now()
		err := postStatusOK(ctx, hc, cfg.urls[k%len(cfg.urls)]+"/v1/status", cfg.apiKey, body)
		took := time.Since(sent)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			fmt.Fprintf(w, "%d -1 %s\n", sent.UnixNano(), strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Fprintf(w, "%d %d\n", sent.UnixNano(), took.Nanoseconds())
		}
		_ = w.Flush()
	}
}

// postStatusOK writes a status and reads the whole answer; an answer
// other than 200 is an error. (The probe's user has no device: the
// status is stored, with no version to answer.)
func postStatusOK(ctx context.Context, hc *http.Client, u, apiKey string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s %s", u, resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

// probeWrite is one write a write probe printed.
type probeWrite struct {
	sent time.Time
	took time.Duration // -1: failed
}

// readProbeWrites parses a write probe's output.
func readProbeWrites(r io.Reader) ([]probeWrite, error) {
	var ws []probeWrite
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			return ws, fmt.Errorf("write probe: line %q", sc.Text())
		}
		sent, err1 := strconv.ParseInt(f[0], 10, 64)
		took, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			return ws, fmt.Errorf("write probe: line %q", sc.Text())
		}
		ws = append(ws, probeWrite{sent: time.Unix(0, sent), took: time.Duration(took)})
	}
	return ws, sc.Err()
}

// startWriteProbe runs a write probe in a process of its own (this
// binary) for d; wait returns what it wrote once it ends.
func startWriteProbe(ctx context.Context, cfg *writeProbeConfig, stderr io.Writer) (wait func() ([]probeWrite, error), err error) {
	exe, err := executable()
	if err != nil {
		return nil, err
	}
	c := exec.CommandContext(ctx, exe, "write-probe", "-url", strings.Join(cfg.urls, ","), "-user", cfg.user,
		"-every", cfg.every.String(), "-for", cfg.dur.String())
	// The key goes through the environment, not the command line.
	c.Env = append(os.Environ(), writeProbeKeyEnv+"="+cfg.apiKey)
	c.Args = append(c.Args, "-api-key", "env:"+writeProbeKeyEnv)
	c.Stderr = stderr
	out, err := c.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("start the write probe: %w", err)
	}
	var (
		once   sync.Once
		writes []probeWrite
		rerr   error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		writes, rerr = readProbeWrites(out)
	}()
	return func() ([]probeWrite, error) {
		once.Do(func() {
			<-done
			if err := c.Wait(); err != nil && rerr == nil && ctx.Err() == nil {
				rerr = fmt.Errorf("write probe: %w", err)
			}
		})
		return writes, rerr
	}, nil
}

// writeProbeKeyEnv carries the API key to a write probe.
const writeProbeKeyEnv = "PRESENCE_BENCH_WRITE_PROBE_KEY"

// probeKey resolves "env:NAME" to that variable.
func probeKey(k string) string {
	if name, ok := strings.CutPrefix(k, "env:"); ok {
		return os.Getenv(name)
	}
	return k
}

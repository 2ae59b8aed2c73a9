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
// prints each write as "w SENT_UNIX_NS LATENCY_NS VERSION" (or "w
// SENT_UNIX_NS -1 ERROR") on its stdout. With -watchers, the user holds
// a socket (on the first -ws) and that many sockets, round-robin over
// -ws, watch it: each delivery of a change is printed at the end as "d
// VERSION READ_UNIX_NS". The storm runs one beside its 9,000 sockets: a
// client on a phone does not share a Go scheduler with the thousands of
// clients reconnecting elsewhere, and the tool's own clients do (their
// goroutines wait behind those of the reconnecting sockets for the
// tool's two threads).

type writeProbeConfig struct {
	urls     []string
	apiKey   string
	user     string
	every    time.Duration
	dur      time.Duration
	ws       []wsEndpoint // the watchers' nodes
	watchers int
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
	var ws urlList
	var dev bool
	fs.Var(&ws, "ws", "the nodes' WebSocket URLs for -watchers, loopback only; repeat or comma-separate")
	fs.IntVar(&c.watchers, "watchers", 0, "sockets that watch the user (and the user holds one: its writes are changes)")
	fs.BoolVar(&dev, "dev", false, "connect with a bare user_id (else a token minted with $"+jwtSecretEnv+")")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if c.watchers < 0 || c.watchers > 1000 {
		return nil, fmt.Errorf("-watchers %d: between 0 and 1000", c.watchers)
	}
	if c.watchers > 0 {
		var err error
		if c.ws, _, err = resolveEndpoints(ws, dev, ""); err != nil {
			return nil, err
		}
		if !dev && c.ws[0].secret == "" {
			return nil, errors.New("-watchers: give -dev or $" + jwtSecretEnv)
		}
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
	if err := writeProbe(ctx, cfg, stdout); err != nil {
		fmt.Fprintf(stderr, "presence-bench: write probe: %v\n", err)
		return 1
	}
	return 0
}

// writeProbe writes until ctx ends, one write in flight, and prints each
// write, then each delivery to its watchers.
func writeProbe(ctx context.Context, cfg *writeProbeConfig, out io.Writer) error {
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	w := bufio.NewWriter(out)
	defer w.Flush()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		got   []fanoutRecv // target: the watcher
		conns []*benchConn // this goroutine's alone
	)
	wctx, stop := context.WithCancel(context.Background())
	defer func() {
		stop()
		for _, c := range conns {
			c.drop()
		}
		wg.Wait()
		for _, r := range got {
			fmt.Fprintf(w, "d %d %d\n", r.version, r.at.UnixNano())
		}
	}()
	if cfg.watchers > 0 {
		own, err := cfg.ws[0].dial(ctx, cfg.user, "probe")
		if err != nil {
			return err
		}
		conns = append(conns, own)
		wg.Add(1)
		go func() {
			defer wg.Done()
			go beatLoop(wctx, own, own.beat())
			for {
				if _, err := own.read(time.Time{}); err != nil {
					return
				}
			}
		}()
		for i := range cfg.watchers {
			c, err := cfg.ws[i%len(cfg.ws)].dial(ctx, cfg.user+"-w"+strconv.Itoa(i), "d")
			if err != nil {
				return err
			}
			conns = append(conns, c)
			if _, err := subscribeWait(c, []string{cfg.user}); err != nil {
				return err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				go beatLoop(wctx, c, c.beat())
				for {
					m, err := c.read(time.Time{})
					if err != nil {
						return
					}
					if at := time.Now(); m.Type == "presence" && m.UserID == cfg.user {
						mu.Lock()
						got = append(got, fanoutRecv{target: i, version: m.Version, at: at})
						mu.Unlock()
					}
				}
			}()
		}
	}
	next := time.Now()
	for k := 0; ; k++ {
		if !sleepUntil(ctx, next) {
			return nil
		}
		next = next.Add(cfg.every)
		status := "online"
		if k%2 == 0 {
			status = "busy"
		}
		body := []byte(`{"user_id":"` + cfg.user + `","status":"` + status + `"}`)
		sent := time.Now()
		u := cfg.urls[k%len(cfg.urls)] + "/v1/status"
		var v uint64
		var err error
		if cfg.watchers > 0 { // online: each write is a change with a version
			v, err = postStatusVersion(ctx, hc, u, cfg.apiKey, body)
		} else {
			_, err = postStatusOK(ctx, hc, u, cfg.apiKey, body)
		}
		took := time.Since(sent)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			fmt.Fprintf(w, "w %d -1 %s\n", sent.UnixNano(), strings.ReplaceAll(err.Error(), "\n", " "))
		} else {
			fmt.Fprintf(w, "w %d %d %d\n", sent.UnixNano(), took.Nanoseconds(), v)
		}
		_ = w.Flush()
	}
}

// postStatusOK writes a status and returns the answer's body; an answer
// other than 200 is an error. (Without watchers the probe's user has no
// device: the status is stored, with no version to answer.)
func postStatusOK(ctx context.Context, hc *http.Client, u, apiKey string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("POST %s: %s %s", u, resp.Status, bytes.TrimSpace(b))
	}
	return b, nil
}

// probeWrite is one write a write probe printed.
type probeWrite struct {
	sent    time.Time
	took    time.Duration // -1: failed
	version uint64        // with watchers
}

// probeDelivery is one change a write probe's watcher read.
type probeDelivery struct {
	version uint64
	at      time.Time
}

// readProbe parses a write probe's output.
func readProbe(r io.Reader) ([]probeWrite, []probeDelivery, error) {
	var ws []probeWrite
	var ds []probeDelivery
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		bad := fmt.Errorf("write probe: line %q", sc.Text())
		switch {
		case len(f) >= 3 && f[0] == "w":
			sent, err1 := strconv.ParseInt(f[1], 10, 64)
			took, err2 := strconv.ParseInt(f[2], 10, 64)
			var v uint64
			var err3 error
			if took >= 0 && len(f) > 3 {
				v, err3 = strconv.ParseUint(f[3], 10, 64)
			}
			if err1 != nil || err2 != nil || err3 != nil {
				return ws, ds, bad
			}
			ws = append(ws, probeWrite{sent: time.Unix(0, sent), took: time.Duration(took), version: v})
		case len(f) == 3 && f[0] == "d":
			v, err1 := strconv.ParseUint(f[1], 10, 64)
			at, err2 := strconv.ParseInt(f[2], 10, 64)
			if err1 != nil || err2 != nil {
				return ws, ds, bad
			}
			ds = append(ds, probeDelivery{version: v, at: time.Unix(0, at)})
		default:
			return ws, ds, bad
		}
	}
	return ws, ds, sc.Err()
}

// startWriteProbe runs a write probe in a process of its own (this
// binary) for d; wait returns what it wrote once it ends.
func startWriteProbe(ctx context.Context, cfg *writeProbeConfig, stderr io.Writer) (wait func() ([]probeWrite, []probeDelivery, error), err error) {
	exe, err := executable()
	if err != nil {
		return nil, err
	}
	c := exec.CommandContext(ctx, exe, "write-probe", "-url", strings.Join(cfg.urls, ","), "-user", cfg.user,
		"-every", cfg.every.String(), "-for", cfg.dur.String(), "-watchers", strconv.Itoa(cfg.watchers))
	// The key and the secret go through the environment, not the command line.
	c.Env = append(os.Environ(), writeProbeKeyEnv+"="+cfg.apiKey)
	for _, e := range cfg.ws {
		c.Args = append(c.Args, "-ws", e.url.String())
	}
	if len(cfg.ws) > 0 {
		if cfg.ws[0].dev {
			c.Args = append(c.Args, "-dev")
		} else {
			c.Env = append(c.Env, jwtSecretEnv+"="+cfg.ws[0].secret)
		}
	}
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
		dels   []probeDelivery
		rerr   error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		writes, dels, rerr = readProbe(out)
	}()
	return func() ([]probeWrite, []probeDelivery, error) {
		once.Do(func() {
			<-done
			if err := c.Wait(); err != nil && rerr == nil && ctx.Err() == nil {
				rerr = fmt.Errorf("write probe: %w", err)
			}
		})
		return writes, dels, rerr
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

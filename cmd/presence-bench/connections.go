package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"text/tabwriter"
	"time"
)

// connResult is the outcome of the connections scenario.
type connResult struct {
	Scenario    string   `json:"scenario"`
	URL         string   `json:"url"`
	N           int      `json:"n"`
	Procs       int      `json:"procs"`
	SourceAddrs []string `json:"source_addrs"`
	Heartbeat   string   `json:"heartbeat"`
	Hold        string   `json:"hold"`
	ServerPID   int      `json:"server_pid"`

	Connected   int64   `json:"connected"`
	Failed      int64   `json:"failed"`
	Dropped     int64   `json:"dropped"`
	Held        int64   `json:"held"` // open at the 'after' sample: connected − dropped
	Beats       int64   `json:"heartbeats"`
	Unexpected  int64   `json:"unexpected_reads"`
	FirstError  string  `json:"first_error,omitempty"`
	RampSeconds float64 `json:"ramp_seconds"`

	Before    sample   `json:"before"`
	HoldStart sample   `json:"hold_start"` // when every connection had been tried
	After     sample   `json:"after"`
	Samples   []sample `json:"hold_samples"` // one per heartbeat interval while held

	// While held: the server's CPU time (user and system), per held
	// connection and second, and the most OS threads it ran.
	HoldCPUSeconds     float64 `json:"hold_cpu_seconds"`
	CPUPerConnPerSecUs float64 `json:"cpu_us_per_conn_per_second"`
	MaxThreads         uint64  `json:"max_threads"`

	// Bytes per held connection: (after − before) / held.
	RSSPerConn        float64 `json:"rss_bytes_per_conn"`
	HeapInusePerConn  float64 `json:"heap_inuse_bytes_per_conn"`
	StackInusePerConn float64 `json:"stack_inuse_bytes_per_conn"`
	SysPerConn        float64 `json:"sys_bytes_per_conn"`
	GoroutinesPerConn float64 `json:"goroutines_per_conn"`
}

// perConn is (after − before) / conns, negative if memory went down, 0
// without connections.
func perConn(before, after uint64, conns int64) float64 {
	if conns <= 0 {
		return 0
	}
	return (float64(after) - float64(before)) / float64(conns)
}

// compute fills in the per-connection figures from Before, After and Held.
func (r *connResult) compute() {
	r.Held = r.Connected - r.Dropped
	r.RSSPerConn = perConn(r.Before.RSS, r.After.RSS, r.Held)
	r.HeapInusePerConn = perConn(r.Before.HeapInuse, r.After.HeapInuse, r.Held)
	r.StackInusePerConn = perConn(r.Before.StackInuse, r.After.StackInuse, r.Held)
	r.SysPerConn = perConn(r.Before.Sys, r.After.Sys, r.Held)
	r.GoroutinesPerConn = perConn(r.Before.Goroutines, r.After.Goroutines, r.Held)
	r.HoldCPUSeconds = r.After.CPU - r.HoldStart.CPU
	if held := r.After.At.Sub(r.HoldStart.At).Seconds(); held > 0 && r.Held > 0 {
		r.CPUPerConnPerSecUs = r.HoldCPUSeconds / held / float64(r.Held) * 1e6
	}
	r.MaxThreads = r.HoldStart.Threads
	for _, s := range r.Samples {
		r.MaxThreads = max(r.MaxThreads, s.Threads)
	}
}

func runConnections(cfg *connConfig, stdout, stderr io.Writer) error {
	port, _ := strconv.Atoi(cfg.wsURL.Port())
	pid := cfg.serverPID
	if pid == 0 {
		var err error
		if pid, err = listeningPID(port); err != nil {
			return err
		}
	}
	srv := &server{pid: pid, metrics: cfg.httpBase + "/metrics", apiKey: cfg.apiKey, hc: &http.Client{}}
	res := &connResult{
		Scenario: "connections", URL: cfg.wsURL.String(), N: cfg.n, Procs: cfg.procs,
		Heartbeat: cfg.heartbeat.String(), Hold: cfg.hold.String(), ServerPID: pid,
	}
	for a := 0; a <= (cfg.n-1)/cfg.perSource; a++ {
		res.SourceAddrs = append(res.SourceAddrs, sourceAddr(a*cfg.perSource, cfg.perSource).String())
	}
	before, err := srv.sample()
	if err != nil {
		return err
	}
	if !before.Metrics {
		fmt.Fprintf(stderr, "warning: no Go heap figures: %s\n", before.MetricsErr)
	}
	if before.MaxFDs > 0 && before.OpenFDs+uint64(cfg.n) > before.MaxFDs {
		fmt.Fprintf(stderr, "warning: the server has %d of %d files open; %d more connections will not fit\n", before.OpenFDs, before.MaxFDs, cfg.n)
	}
	res.Before = before
	fmt.Fprintf(stderr, "server pid %d: RSS %s, heap in use %s before; opening %d connections from %d processes, %v\n",
		pid, kib(float64(before.RSS)), kib(float64(before.HeapInuse)), cfg.n, cfg.procs, res.SourceAddrs)

	exe, err := executable()
	if err != nil {
		return err
	}
	parts := split(cfg.n, cfg.procs)
	workers := make([]*workerProcess, len(parts))
	cmds := make([]*exec.Cmd, len(parts))
	stops := make([]io.WriteCloser, len(parts))
	ready := make(chan struct{}, len(parts))
	done := make(chan struct{}, len(parts))
	defer func() { // whatever happens, no worker outlives the run
		for i, c := range cmds {
			if c != nil && c.Process != nil && c.ProcessState == nil {
				stops[i].Close()
			}
		}
	}()
	start := time.Now()
	for i, p := range parts {
		args := []string{"connections", "-worker",
			"-url", cfg.wsURL.String(), "-first", strconv.Itoa(p[0]), "-count", strconv.Itoa(p[1]),
			"-heartbeat", cfg.heartbeat.String(), "-hold", cfg.hold.String(),
			"-per-source", strconv.Itoa(cfg.perSource), "-concurrency", strconv.Itoa(cfg.concurrency),
			"-ramp-timeout", cfg.rampTimeout.String()}
		if cfg.dev {
			args = append(args, "-dev")
		}
		c := exec.Command(exe, args...)
		c.Env = os.Environ()
		if cfg.jwtSecret != "" {
			c.Env = append(c.Env, jwtSecretEnv+"="+cfg.jwtSecret)
		}
		c.Stderr = stderr
		stop, err := c.StdinPipe()
		if err != nil {
			return err
		}
		out, err := c.StdoutPipe()
		if err != nil {
			return err
		}
		if err := c.Start(); err != nil {
			return fmt.Errorf("start worker: %w", err)
		}
		cmds[i], stops[i], workers[i] = c, stop, &workerProcess{}
		go workers[i].readStatus(out, ready, done)
	}
	total := func() workerStatus {
		var t workerStatus
		for _, w := range workers {
			s := w.get()
			t.Connected += s.Connected
			t.Failed += s.Failed
			t.Dropped += s.Dropped
			t.Beats += s.Beats
			t.Unexpected += s.Unexpected
			if t.FirstError == "" {
				t.FirstError = s.FirstError
			}
		}
		return t
	}

	// Ramp: until every worker has tried all its connections.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, lastAt := int64(0), start
	for pending := len(parts); pending > 0; {
		select {
		case <-ready:
			pending--
		case now := <-tick.C:
			t := total()
			rate := float64(t.Connected-last) / now.Sub(lastAt).Seconds()
			last, lastAt = t.Connected, now
			fmt.Fprintf(stderr, "ramp %6.1fs  %d/%d connected  %d failed  %.0f/s\n", now.Sub(start).Seconds(), t.Connected, cfg.n, t.Failed, rate)
		}
	}
	res.RampSeconds = time.Since(start).Seconds()
	t := total()
	fmt.Fprintf(stderr, "ramp done in %.1fs: %d connected, %d failed; holding %v (a sample every %v)\n", res.RampSeconds, t.Connected, t.Failed, cfg.hold, cfg.heartbeat)

	// Hold: idle connections that only heartbeat; sample once per interval.
	if res.HoldStart, err = srv.sample(); err != nil {
		return err
	}
	holdEnd := time.Now().Add(cfg.hold)
	for {
		wait := min(cfg.heartbeat, time.Until(holdEnd))
		if wait > 0 {
			time.Sleep(wait)
		}
		s, err := srv.sample()
		if err != nil {
			return err
		}
		t := total()
		fmt.Fprintf(stderr, "hold %6.1fs  RSS %s  heap in use %s  heap idle not returned %s  goroutines %d  threads %d  CPU %.2fs  open %d  dropped %d  beats %d\n",
			cfg.hold.Seconds()-time.Until(holdEnd).Seconds(), kib(float64(s.RSS)), kib(float64(s.HeapInuse)), kib(float64(s.HeapIdle-s.HeapReleased)), s.Goroutines, s.Threads, s.CPU-res.HoldStart.CPU, t.Connected-t.Dropped, t.Dropped, t.Beats)
		res.Samples = append(res.Samples, s)
		if !time.Now().Before(holdEnd) {
			break
		}
	}
	res.After = res.Samples[len(res.Samples)-1]
	t = total()
	res.Connected, res.Failed, res.Dropped, res.Beats, res.Unexpected, res.FirstError = t.Connected, t.Failed, t.Dropped, t.Beats, t.Unexpected, t.FirstError
	res.compute()

	// End: close every worker's stdin; each closes its connections and exits.
	for _, s := range stops {
		s.Close()
	}
	timeout := time.After(30 * time.Second)
	for range parts {
		select {
		case <-done:
		case <-timeout:
			for _, c := range cmds {
				_ = c.Process.Kill()
			}
		}
	}
	for _, c := range cmds {
		_ = c.Wait()
	}
	if cfg.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	printResult(stdout, res)
	return nil
}

func printResult(w io.Writer, r *connResult) {
	fmt.Fprintf(w, "connections: %d asked, %d connected, %d failed, %d dropped while held, %d held; %d heartbeats; ramp %.2fs, hold %s\n",
		r.N, r.Connected, r.Failed, r.Dropped, r.Held, r.Beats, r.RampSeconds, r.Hold)
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", r.FirstError)
	}
	if r.Unexpected > 0 {
		fmt.Fprintf(w, "the server sent %d unexpected reads to idle connections\n", r.Unexpected)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "server (pid "+strconv.Itoa(r.ServerPID)+")\tbefore\tafter\tper connection\t")
	fmt.Fprintf(tw, "RSS\t%s\t%s\t%s\t\n", kib(float64(r.Before.RSS)), kib(float64(r.After.RSS)), kib(r.RSSPerConn))
	if r.After.Metrics && r.Before.Metrics {
		fmt.Fprintf(tw, "heap in use\t%s\t%s\t%s\t\n", kib(float64(r.Before.HeapInuse)), kib(float64(r.After.HeapInuse)), kib(r.HeapInusePerConn))
		fmt.Fprintf(tw, "stacks in use\t%s\t%s\t%s\t\n", kib(float64(r.Before.StackInuse)), kib(float64(r.After.StackInuse)), kib(r.StackInusePerConn))
		fmt.Fprintf(tw, "heap idle, not returned\t%s\t%s\t%s\t\n", kib(float64(r.Before.HeapIdle-r.Before.HeapReleased)), kib(float64(r.After.HeapIdle-r.After.HeapReleased)),
			kib(perConn(r.Before.HeapIdle-r.Before.HeapReleased, r.After.HeapIdle-r.After.HeapReleased, r.Held)))
		fmt.Fprintf(tw, "Go sys\t%s\t%s\t%s\t\n", kib(float64(r.Before.Sys)), kib(float64(r.After.Sys)), kib(r.SysPerConn))
		fmt.Fprintf(tw, "goroutines\t%d\t%d\t%.3f\t\n", r.Before.Goroutines, r.After.Goroutines, r.GoroutinesPerConn)
	}
	fmt.Fprintf(tw, "OS threads (most while held)\t%d\t%d\t\t\n", r.Before.Threads, r.MaxThreads)
	fmt.Fprintf(tw, "CPU while held\t\t%.2f s\t%.2f µs/s\t\n", r.HoldCPUSeconds, r.CPUPerConnPerSecUs)
	_ = tw.Flush()
}

// kib formats bytes as KiB (MiB above 10 MiB).
func kib(b float64) string {
	if b >= 10<<20 || b <= -10<<20 {
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	}
	return fmt.Sprintf("%.2f KiB", b/1024)
}

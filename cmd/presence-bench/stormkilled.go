package main

// The killed node's sockets, in a process of their own. The storm starts
// this binary as "presence-bench storm-killed ARGS -tag TAG" with its own
// arguments: the process makes the same population (newStormPopulation)
// and holds the sockets of the node to be killed — connects them,
// subscribes, heartbeats, and once the node dies reconnects them to the
// survivors and subscribes again — while the storm holds the survivors'
// sockets and the probes. Three thousand clients reconnecting at once
// are three thousand goroutines runnable at once; in the storm's own
// process they held its two threads, and its probes' POSTs and
// deliveries waited behind them (figures of the tool, not of the
// server). A phone that watches a user does not share a Go scheduler
// with the clients reconnecting elsewhere.
//
// The two talk in lines. The process prints "ready" once every socket
// is subscribed. The storm writes "settled" (offlines count from now),
// "killing" (the node is about to die: its sockets' breaking is
// expected), which the process answers "killing" before the storm kills
// the node, and "stop": the process ends its sockets and prints its
// report (stormKilledReport) as one line of JSON.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"
)

// stormHolder owns a run's sockets: their goroutines, and the
// connections open at the moment, to be dropped at the end.
type stormHolder struct {
	sh        *stormShared
	cancel    context.CancelFunc // ends the run's context
	survivors []int
	wg        sync.WaitGroup // every socket's goroutines
	live      liveConns
	stop      func() // ends every socket and waits for their goroutines
}

func newStormHolder(sh *stormShared, cancel context.CancelFunc, survivors []int) *stormHolder {
	h := &stormHolder{sh: sh, cancel: cancel, survivors: survivors}
	h.stop = sync.OnceFunc(func() {
		h.cancel()
		h.live.dropAll()
		h.wg.Wait()
	})
	return h
}

// dial connects each of sockets to its node and subscribes it, then
// serves it (stormShared.serve) until the run ends.
func (h *stormHolder) dial(ctx context.Context, sockets []*stormSocket, what string, progress io.Writer) error {
	cfg := h.sh.cfg
	return dialAll(ctx, len(sockets), what, progress, func(i int) error {
		so := sockets[i]
		c, err := cfg.eps[so.node].dialSrc(ctx, so.user, "d", so.src)
		if err != nil {
			return err
		}
		h.live.track(c, true)
		snap, err := subscribeWait(c, so.subs)
		if err != nil {
			return fmt.Errorf("socket %d: %w", so.idx, err)
		}
		h.sh.look(so, snap, time.Now())
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.sh.serve(so, c, h.survivors, h.live.track)
		}()
		return nil
	})
}

// stormSurvivors are the indexes of the nodes not killed.
func stormSurvivors(cfg *stormConfig) []int {
	var s []int
	for i := range cfg.eps {
		if i != cfg.kill {
			s = append(s, i)
		}
	}
	return s
}

// stormKilledReport is what the killed node's sockets went through.
type stormKilledReport struct {
	Sockets    []killedSocket `json:"sockets"`
	FalseAll   int64          `json:"false_offline"`
	FalseSnap  int64          `json:"false_offline_in_snapshots"`
	FalseBy    map[string]int `json:"false_offline_by_user,omitempty"`
	FalseFirst []falseShown   `json:"false_offline_first,omitempty"`
	Errors     int64          `json:"errors"`
	FirstError string         `json:"first_error,omitempty"`
}

// killedSocket is one socket of the killed node.
type killedSocket struct {
	Idx         int       `json:"idx"`
	Reconnected int64     `json:"reconnected_unix_ns"` // 0: never
	Attempts    int       `json:"attempts"`
	Resub       resubCost `json:"resub"`
}

// report is what sh and sockets (whose goroutines have ended) saw.
func (s *stormShared) report(sockets []*stormSocket) *stormKilledReport {
	r := &stormKilledReport{FalseAll: s.falseAll.Load(), FalseSnap: s.falseSnap.Load(), Errors: s.errs.n.Load(), FirstError: s.errs.firstErr()}
	s.mu.Lock()
	r.FalseBy, r.FalseFirst = s.falseBy, s.falseFirst
	s.mu.Unlock()
	for _, so := range sockets {
		k := killedSocket{Idx: so.idx, Attempts: so.attempts, Resub: so.resub}
		if !so.reconnected.IsZero() {
			k.Reconnected = so.reconnected.UnixNano()
		}
		r.Sockets = append(r.Sockets, k)
	}
	return r
}

// merge adds the report of the killed node's sockets to what s saw and to
// sockets.
func (s *stormShared) merge(r *stormKilledReport, sockets []*stormSocket) error {
	for _, k := range r.Sockets {
		if k.Idx < 0 || k.Idx >= len(sockets) || !sockets[k.Idx].killed {
			return fmt.Errorf("storm-killed: socket %d is not one of the killed node's", k.Idx)
		}
		so := sockets[k.Idx]
		so.attempts, so.resub = k.Attempts, k.Resub
		if k.Reconnected != 0 {
			so.reconnected = time.Unix(0, k.Reconnected)
		}
	}
	s.falseAll.Add(r.FalseAll)
	s.falseSnap.Add(r.FalseSnap)
	s.mu.Lock()
	for u, n := range r.FalseBy {
		s.falseBy[u] += n
	}
	s.falseFirst = append(s.falseFirst, r.FalseFirst...)
	s.mu.Unlock()
	if r.Errors > 0 {
		s.errs.add(fmt.Errorf("the killed node's sockets: %s", r.FirstError))
		s.errs.n.Add(r.Errors - 1)
	}
	return nil
}

// runStormKilledCmd is the storm-killed command: the killed node's
// sockets of the storm whose arguments it is given, told what to do on
// stdin.
func runStormKilledCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cfg, err := parseStorm(args, stderr)
	if st := parseStatus(err, stderr); st >= 0 {
		return st
	}
	return runStatus(stormKilled(context.Background(), cfg, stdin, stdout, stderr), stderr)
}

// stormKilled holds the killed node's sockets of cfg's run until told to
// stop on in, and then prints its report on out.
func stormKilled(parent context.Context, cfg *stormConfig, in io.Reader, out, stderr io.Writer) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	sh, sockets, _ := newStormPopulation(ctx, cfg)
	h := newStormHolder(sh, cancel, stormSurvivors(cfg))
	defer h.stop()
	var mine []*stormSocket
	for _, so := range sockets {
		if so.killed {
			mine = append(mine, so)
		}
	}
	if err := h.dial(ctx, mine, "storm killed node's sockets", stderr); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch cmd := sc.Text(); cmd {
		case "settled":
			sh.settled.Store(true)
		case "killing":
			sh.killing.Store(true)
			if _, err := fmt.Fprintln(out, "killing"); err != nil {
				return err
			}
			h.wg.Add(1)
			go func() { defer h.wg.Done(); allBack(ctx, sh, len(mine), stderr) }()
		case "stop":
			h.stop()
			return json.NewEncoder(out).Encode(sh.report(mine))
		default:
			return fmt.Errorf("storm-killed: unknown command %q", cmd)
		}
	}
	return errors.New("storm-killed: the storm ended without a stop")
}

// allBack says on progress when all n of the killed node's sockets are
// subscribed again, or how many are when ctx ends.
func allBack(ctx context.Context, sh *stormShared, n int, progress io.Writer) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for sh.back.Load() < int64(n) {
		select {
		case <-ctx.Done():
			fmt.Fprintf(progress, "storm-killed: %d of %d sockets back on the survivors\n", sh.back.Load(), n)
			return
		case <-tick.C:
		}
	}
	fmt.Fprintf(progress, "storm-killed: all %d sockets back on the survivors\n", n)
}

// killedProc is the storm's side of a storm-killed process.
type killedProc struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan []byte // its stdout, a line at a time; closed at its end
	once  sync.Once
	err   error // of cmd.Wait, once lines is closed
}

// startStormKilled starts the process that holds the killed node's
// sockets of cfg's run.
func startStormKilled(ctx context.Context, cfg *stormConfig, stderr io.Writer) (*killedProc, error) {
	exe, err := executable()
	if err != nil {
		return nil, err
	}
	args := append([]string{"storm-killed"}, cfg.args...)
	c := exec.Command(exe, append(args, "-tag", cfg.tag)...)
	c.Stderr = stderr
	in, err := c.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := c.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("start the killed node's sockets: %w", err)
	}
	p := &killedProc{cmd: c, in: in, lines: make(chan []byte, 4)}
	go func() {
		defer close(p.lines)
		r := bufio.NewReader(out)
		for {
			line, err := r.ReadBytes('\n')
			if len(line) > 0 {
				p.lines <- line
			}
			if err != nil {
				return
			}
		}
	}()
	return p, nil
}

// expect waits for the next line of the process, which must start with
// want.
func (p *killedProc) expect(ctx context.Context, want string) ([]byte, error) {
	select {
	case line, ok := <-p.lines:
		if !ok {
			p.wait()
			return nil, fmt.Errorf("the killed node's sockets ended (%v) before %q", p.err, want)
		}
		if len(line) < len(want) || string(line[:len(want)]) != want {
			return nil, fmt.Errorf("the killed node's sockets said %.100q, want %q", line, want)
		}
		return line, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ready waits until every socket of the process is subscribed.
func (p *killedProc) ready(ctx context.Context) error {
	_, err := p.expect(ctx, "ready")
	return err
}

// tell writes one command to the process.
func (p *killedProc) tell(cmd string) error {
	_, err := io.WriteString(p.in, cmd+"\n")
	return err
}

// killing tells the process the node is about to die and waits until it
// knows.
func (p *killedProc) killing(ctx context.Context) error {
	if err := p.tell("killing"); err != nil {
		return err
	}
	_, err := p.expect(ctx, "killing")
	return err
}

// finish stops the process and returns its report.
func (p *killedProc) finish(ctx context.Context) (*stormKilledReport, error) {
	if err := p.tell("stop"); err != nil {
		return nil, err
	}
	line, err := p.expect(ctx, "{")
	if err != nil {
		return nil, err
	}
	var r stormKilledReport
	if err := json.Unmarshal(line, &r); err != nil {
		return nil, fmt.Errorf("the killed node's sockets' report: %w", err)
	}
	p.wait()
	return &r, nil
}

// wait closes the process's stdin and waits for it to end.
func (p *killedProc) wait() {
	p.once.Do(func() {
		_ = p.in.Close()
		for range p.lines {
		}
		p.err = p.cmd.Wait()
	})
}

// abort ends the process, whatever it is doing.
func (p *killedProc) abort() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Signal(os.Interrupt)
	}
	p.wait()
}

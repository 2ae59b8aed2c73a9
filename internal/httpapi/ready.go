package httpapi

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// checkTimeout is what a readiness probe gives its checks.
const checkTimeout = 2 * time.Second

// stallSlack is how late a probe's deadline may fire before the probe
// takes it that this node did not run meanwhile (a frozen process, a
// starved machine) rather than that its checks were slow.
const stallSlack = time.Second

// States of a check in the /readyz body, besides a StateError's.
const (
	stateOK          = "ok"
	stateUnavailable = "unavailable"
)

// errProbeDeadline is the cause of a probe's context ended by its own
// deadline.
var errProbeDeadline = fmt.Errorf("no answer within the probe's %v", checkTimeout)

// StateError is a Check's error that names the part's state in the
// /readyz body instead of "unavailable": a part that answers but is not
// whole, such as NATS without the changes stream ("stream_missing").
// State is one word of the API (docs/operations.md, "Readiness").
type StateError struct {
	State string
	Err   error
}

func (e *StateError) Error() string { return e.State + ": " + e.Err.Error() }

func (e *StateError) Unwrap() error { return e.Err }

// checkResult is one readiness check's outcome: its state, "ok",
// "unavailable" or a StateError's.
type checkResult struct{ name, state string }

// runChecks runs every readiness check at once, within checkTimeout of
// parent, and returns why this node is not ready ("draining", or the
// first of its own parts that fails; empty: ready) and each check's state,
// in order. A change of a check's state is logged, with the check's error.
//
// A check still running when the probe's context ends is judged by why it
// ended: the probe's deadline, fired on time, is the check's failure (it
// did not answer within checkTimeout); a deadline that fired more than
// stallSlack late says this node itself did not run (frozen or starved:
// every check would have looked failed), and the caller of the probe
// going away (a load balancer's shorter timeout, say) says nothing about
// the checks either. Such checks are not judged: they keep the state they
// had, and one line says why the probe could not judge them.
func (s *Server) runChecks(parent context.Context) (reason string, results []checkResult) {
	due := time.Now().Add(checkTimeout)
	ctx, cancel := context.WithDeadlineCause(parent, due, errProbeDeadline)
	defer cancel()
	ended := make(chan time.Time, 1) // when ctx ended, sent once it has
	context.AfterFunc(ctx, func() { ended <- time.Now() })
	errs := make([]error, len(s.checks))
	cut := make([]bool, len(s.checks)) // still running when ctx ended
	var wg sync.WaitGroup
	for i, c := range s.checks {
		wg.Go(func() {
			errs[i] = c.Check(ctx)
			cut[i] = errs[i] != nil && ctx.Err() != nil
		})
	}
	wg.Wait()

	judge := true // the cut checks are failures of their own
	var why string
	if ctx.Err() != nil {
		at := <-ended
		switch late := at.Sub(due); {
		case !errors.Is(context.Cause(ctx), errProbeDeadline):
			judge, why = false, "the probe's caller went away before they answered"
		case late > stallSlack:
			judge = false
			why = fmt.Sprintf("this node did not run for a while: the probe's %v deadline fired %v late", checkTimeout, late.Round(time.Millisecond))
		}
	}
	var unjudged []string
	results = make([]checkResult, len(s.checks))
	s.checkMu.Lock()
	defer s.checkMu.Unlock()
	for i, c := range s.checks {
		err := errs[i]
		if cut[i] {
			if !judge {
				results[i] = checkResult{name: c.Name, state: s.checkSt[i]}
				unjudged = append(unjudged, c.Name)
				if !c.Shared && reason == "" && s.checkSt[i] != stateOK {
					reason = c.Name
				}
				continue
			}
			err = fmt.Errorf("%w (%v)", errProbeDeadline, err)
		}
		state := stateOK
		if err != nil {
			state = stateUnavailable
			var se *StateError
			if errors.As(err, &se) {
				state = se.State
			}
			if !c.Shared && reason == "" {
				reason = c.Name
			}
		}
		results[i] = checkResult{name: c.Name, state: state}
		if prev := s.checkSt[i]; prev != state {
			s.checkSt[i] = state
			if err == nil {
				s.log.Info("readiness check passes again", "check", c.Name)
			} else {
				s.log.Warn("readiness check fails", "check", c.Name, "shared", c.Shared, "state", state, "err", err)
			}
		}
	}
	if len(unjudged) > 0 {
		s.log.Warn("readiness checks not judged: "+why, "checks", strings.Join(unjudged, ","))
	}
	if s.draining.Load() {
		reason = "draining"
	}
	return reason, results
}

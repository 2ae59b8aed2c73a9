// Package jsstream holds what presenced's two NATS JetStream users (the
// natsbus and ingest packages) share: the node's one connection and
// JetStream handle (Conn), declaring their streams safely when several
// nodes start at once, and naming a server without its credentials.
//
// Every node declares the streams it needs at start and again after a
// NATS server lost them. Declaring must not send an update request for a
// stream another node is still creating: nats-server 2.9 (Debian 12's
// package) dereferences a half-built stream there and crashes, taking
// every node's connection with it. So Ensure asks for a create first —
// which the server answers with success when the stream exists with the
// same configuration — and sends an update only when an existing
// stream's configuration differs (an older release's, say). A request the
// server does not answer in time is sent again: a server busy with other
// nodes' creates has been seen to drop one now and then.
package jsstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Creator is the part of jetstream.JetStream that Ensure uses.
type Creator interface {
	CreateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error)
	UpdateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error)
}

// attempts bounds the create/update rounds when other nodes keep changing
// the stream at the same time, or the server leaves a request unanswered.
const attempts = 5

// firstWait is how long the first request may go unanswered before it is
// sent again; each later one may wait twice as long as the one before.
const firstWait = time.Second

// Ensure makes the stream cfg.Name exist with configuration cfg.
func Ensure(ctx context.Context, js Creator, cfg jetstream.StreamConfig) error {
	var err error
	wait := firstWait
	for i := range attempts {
		err = ensureOnce(ctx, js, cfg, wait)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("create or update stream %s: %w", cfg.Name, err)
		case errors.Is(err, context.DeadlineExceeded):
			// Unanswered, while the caller still waits: send it again.
			wait *= 2
			continue
		case overlaps(err):
			// Another node's create of this very stream got in between
			// the server's name check and its subject check: once that
			// create is done, ours finds the stream as it wants it. (A
			// different stream holding the subjects fails every round.)
			select {
			case <-ctx.Done():
				return fmt.Errorf("create or update stream %s: %w", cfg.Name, err)
			case <-time.After(time.Duration(i+1) * 50 * time.Millisecond):
			}
			continue
		case errors.Is(err, jetstream.ErrStreamNotFound):
			// Deleted between the create and the update: create it again.
			continue
		}
		break
	}
	return fmt.Errorf("create or update stream %s: %w", cfg.Name, err)
}

// ensureOnce asks for a create and, when a stream of that name exists with
// another configuration, an update; each request may take up to wait.
func ensureOnce(ctx context.Context, js Creator, cfg jetstream.StreamConfig, wait time.Duration) error {
	rctx, cancel := context.WithTimeout(ctx, wait)
	_, err := js.CreateStream(rctx, cfg)
	cancel()
	if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return err
	}
	// It exists with another configuration: update it.
	rctx, cancel = context.WithTimeout(ctx, wait)
	defer cancel()
	_, err = js.UpdateStream(rctx, cfg)
	return err
}

// errSubjectsOverlap is the server's error code for a stream whose
// subjects another stream already captures.
const errSubjectsOverlap = 10065

func overlaps(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errSubjectsOverlap
}

// RedactURL drops the user information of a URL, or of each URL of a
// comma-separated server list (as nats.Connect takes), for messages.
func RedactURL(u string) string {
	parts := strings.Split(u, ",")
	for k, p := range parts {
		if i := strings.LastIndex(p, "@"); i >= 0 {
			if j := strings.Index(p, "://"); j >= 0 && j < i {
				parts[k] = p[:j+3] + "***" + p[i:]
			} else {
				parts[k] = "***" + p[i:]
			}
		}
	}
	return strings.Join(parts, ",")
}

// Package jsstream creates the JetStream streams presenced uses, safely
// when several nodes start at once.
//
// Every node declares the streams it needs at start and again after a
// NATS server lost them. Declaring must not send an update request for a
// stream another node is still creating: nats-server 2.9 (Debian 12's
// package) dereferences a half-built stream there and crashes, taking
// every node's connection with it. So Ensure asks for a create first —
// which the server answers with success when the stream exists with the
// same configuration — and sends an update only when an existing
// stream's configuration differs (an older release's, say).
package jsstream

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Creator is the part of jetstream.JetStream that Ensure uses.
type Creator interface {
	CreateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error)
	UpdateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error)
}

// attempts bounds the create/update rounds when other nodes keep changing
// the stream at the same time.
const attempts = 5

// Ensure makes the stream cfg.Name exist with configuration cfg.
func Ensure(ctx context.Context, js Creator, cfg jetstream.StreamConfig) error {
	var err error
	for i := range attempts {
		if _, err = js.CreateStream(ctx, cfg); err == nil {
			return nil
		}
		if overlaps(err) {
			// Another node's create of this very stream got in between
			// the server's name check and its subject check: once that
			// create is done, ours finds the stream as it wants it. (A
			// different stream holding the subjects fails every round.)
			if !sleep(ctx, time.Duration(i+1)*50*time.Millisecond) {
				break
			}
			continue
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			break
		}
		// It exists with another configuration: update it.
		if _, err = js.UpdateStream(ctx, cfg); err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			break
		}
		// Deleted between the two requests: create it again.
	}
	return fmt.Errorf("create or update stream %s: %w", cfg.Name, err)
}

// errSubjectsOverlap is the server's error code for a stream whose
// subjects another stream already captures.
const errSubjectsOverlap = 10065

func overlaps(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errSubjectsOverlap
}

// sleep waits d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

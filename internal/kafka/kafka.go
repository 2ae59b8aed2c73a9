// Package kafka connects presenced to the Kafka a company already runs, in
// both directions, with franz-go (github.com/twmb/franz-go):
//
//   - Consumer reads session events of an existing connection layer from a
//     topic (default "presence.updates") in a consumer group every node
//     joins, and applies them through the tracker by the rules of package
//     ingest. It commits an offset only once every event up to it was
//     applied or skipped; the records of a poll are applied per device
//     (window.go), and the first poll after an assignment as a replay that
//     shows nothing twice, whatever part of it a dead node had applied.
//   - Producer is a tracker.Publisher: every change this node makes goes to
//     a topic (default "presence.changes"), keyed by user id, idempotently,
//     as the message of the NATS stream (wire.AppendChange); and every join
//     and leave of a room to the same topic, keyed by room id, with the
//     header "kind: room" (wire.AppendRoomEvent).
//
// Kafka and NATS are independent: either runs on the embedded node as well
// as with the scale-out backends, and both may run at once.
//
// What an operator sets up and sees — offsets, rebalances, malformed
// records, failures, known limits, a consumer — is in docs/operations.md
// ("Kafka"); why a poll is applied per device, in docs/internals.md
// ("Choices of libraries and formats").
package kafka

import (
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/presenced/presenced/internal/loglimit"
)

// Default topic and group names.
const (
	DefaultIngestTopic  = "presence.updates"
	DefaultChangesTopic = "presence.changes"
	DefaultGroup        = "presenced"
)

// recoveryOpts make a client find the brokers again within about a second
// of their return (franz-go's defaults take up to 5 s twice: the backoff
// of a request and the minimum age of the metadata a reconnect needs).
// Presence is worth it, and a node has only two clients.
func recoveryOpts() []kgo.Opt {
	return []kgo.Opt{kgo.RetryBackoffFn(backoff), kgo.MetadataMinAge(time.Second)}
}

// backoff is the wait before a request is tried again after the n-th
// failure in a row: from 100 ms, doubling, at most 1 s, with jitter (the
// upper half of it).
func backoff(n int) time.Duration {
	d := min(100*time.Millisecond<<min(max(n-1, 0), 4), time.Second)
	return d/2 + rand.N(d/2+1)
}

// kgoLogger hands franz-go's warnings and errors to slog, at most one line
// per message a second.
type kgoLogger struct {
	log  *slog.Logger
	logs *loglimit.Limiter
}

func (l kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelWarn
	switch level {
	case kgo.LogLevelError:
		lv = slog.LevelError
	case kgo.LogLevelWarn:
	default:
		return
	}
	l.logs.Log(l.log, lv, msg, msg, keyvals...)
}

// Package kafka connects presenced to the Kafka a company already runs, in
// both directions, with franz-go (github.com/twmb/franz-go):
//
//   - Consumer reads session events of an existing connection layer from a
//     topic (default "presence.updates") in a consumer group that every
//     node joins, and applies them through the tracker by the rules of
//     package ingest: the same three events and the same JSON as the
//     JetStream ingest.
//   - Producer is a tracker.Publisher: it writes every change of presence
//     this node makes to a topic (default "presence.changes"), keyed by
//     user id, with an idempotent producer, as the message of the NATS
//     stream presence.changes (wire.AppendChange).
//
// Kafka and NATS are independent: either runs on the embedded node as well
// as with the scale-out backends, and both may run at once.
//
// # Ingest: delivery, order and idempotency
//
// Publish events keyed by user id (the record key is the user_id), so all
// of a user's events land on one partition, in order; one node of the group
// owns a partition at a time. The consumer polls up to Batch records and
// applies them; it commits a partition's offset only once every event up
// to it was applied by the tracker (which, while the state store is down,
// means held in the node, as for the JetStream ingest), skipped as stale,
// invalid or a duplicate, refused for good, or given up after MaxAttempts
// failures. A node that dies leaves what it did not commit to the next
// owner of the partition, which reads it again.
//
// Applying again must show nothing twice, so the records a node polls
// from one partition form a window that is applied per device, not per
// record (window.go): each device's events come down to at most a beat
// (at the place of its first beat; active if one of its beats since its
// last disconnect was) and then a disconnect (at the place of its last),
// so that a device that disconnected and reconnected within the window
// stays alive throughout, repeated beats are one call, and the devices of
// a user still come and go in the order of their events. A session that
// began and ended within the window is shown coming and going.
//
// After a partition is assigned, its first window is a replay: it reaches
// from the committed offset to the partition's end at assignment (every
// record the previous owner could have applied; up to MaxWindow devices,
// or what arrived within CatchUpWait), and it is applied so that whatever
// part of it the previous owner applied before it died, nothing is shown
// twice: a device whose last event is a disconnect is only disconnected
// (a session within the replay is not shown, and its last_seen not
// moved), and the beats of the devices that stay alive go before every
// disconnect. window_test.go checks both on random event sequences against
// every prefix the dead node may have applied. Across windows the rules of
// ingest.Memory hold: a heartbeat or connect at or before a disconnect the
// node applied is skipped, and an older disconnect after a reconnect; beats
// older than the ttl are stale.
//
// Malformed records (not JSON, unknown type, bad ids, no or bad at, too far
// in the future, larger than ingest.MaxMessageSize) are counted and
// skipped, never retried. A tracker error that is the event's own fault
// (ingest.Refused) skips it. Any other error (the store cannot take it) is
// retried with a growing delay, the partition paused meanwhile and its
// offset not committed past it, until MaxAttempts, then counted as given
// up; consuming never stops for a record.
//
// Rebalances wait for the records polled to be applied (franz-go's
// BlockRebalanceOnPoll): a poll's work is bounded by MaxHold and cut short
// when a rebalance is waiting, whatever was not applied then being left
// uncommitted; a revoked partition's applied offsets are committed before
// it moves. A node that stops leaves the group at once; one that dies is
// noticed after SessionTimeout. What is not handled: a node cut off from
// the brokers but not from the tracker's store may still apply the poll in
// its hands while the new owner replays it (a zombie, for at most MaxHold);
// and the disconnect memory is per node, so a connect the connection layer
// publishes again after its disconnect, read by another node than the one
// that applied the disconnect, keeps that device alive for at most one
// ttl.
//
// # Changes out
//
// Every change the tracker publishes on this node is produced once, keyed
// by user id (Kafka's murmur2 partitioning, as the Java client), so a
// consumer reads each user's changes in order; the producer is idempotent
// (franz-go's default: a retried batch is written once) and waits for all
// in-sync replicas. Publish never blocks: records wait in the client while
// the brokers are down, at most QueueLen of them; beyond that a change is
// dropped and counted. A consumer keeps the highest version it stored per
// user and drops a message at or below it.
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

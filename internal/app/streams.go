package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/presenced/presenced/internal/httpapi"
	"github.com/presenced/presenced/internal/ingest"
	"github.com/presenced/presenced/internal/ingestroute"
	"github.com/presenced/presenced/internal/kafka"
	"github.com/presenced/presenced/internal/webhook"
)

// openWebhooks builds the sender of webhooks, when configured. On an
// embedded node this node's changes go to the outbox in its SQLite file
// (validate refused PostgreSQL without NATS); with NATS they are
// delivered from the stream the bus publishes every change to, by one
// node at a time per URL. Like the bus, it outlives the tracker: its last
// changes go out.
func (a *App) openWebhooks(ctx context.Context) error {
	if len(a.cfg.WebhookURLs) == 0 {
		return nil
	}
	hooks := webhook.Config{URLs: a.cfg.WebhookURLs, Secret: a.cfg.WebhookSecret, Clock: a.cfg.Clock,
		Logger: a.cfg.Logger.With("component", "webhook")}
	var err error
	p := part{stop: stopBus}
	if a.bus == nil {
		if hooks.Outbox, _ = a.durable.(webhook.Outbox); hooks.Outbox == nil {
			return errors.New("webhooks: the durable store keeps no outbox")
		}
		if a.webhooks, err = webhook.New(ctx, hooks); err != nil {
			return err
		}
		p.publish = a.webhooks
	} else {
		hooks.Stream = &webhook.StreamConfig{Conn: a.nats, Stream: a.bus.StreamName(), Confirmer: a.bus, NodeID: a.bus.NodeID()}
		if a.webhooks, err = webhook.New(ctx, hooks); err != nil {
			return fmt.Errorf("webhooks on the NATS stream: %w", err)
		}
	}
	a.stats.Webhooks = a.webhooks.Stats
	p.run = quiet(a.webhooks.Run)
	a.add(p)
	return nil
}

// kafkaClientID is this node's client id with the Kafka brokers.
func (a *App) kafkaClientID() string {
	if a.cfg.NodeID != "" {
		return "presenced-" + a.cfg.NodeID
	}
	return "presenced"
}

// openKafkaOut builds, with Kafka, the producer of this node's changes
// (each change is produced by the one node that made it). Like the bus,
// it outlives the tracker.
func (a *App) openKafkaOut(context.Context) error {
	if len(a.cfg.KafkaBrokers) == 0 || a.cfg.NoKafkaChanges {
		return nil
	}
	var err error
	if a.kafkaOut, err = kafka.NewProducer(kafka.ProducerConfig{Brokers: a.cfg.KafkaBrokers, Topic: a.cfg.KafkaChangesTopic,
		ClientID: a.kafkaClientID(), Logger: a.cfg.Logger.With("component", "kafka-changes")}); err != nil {
		return err
	}
	a.stats.KafkaChanges = a.kafkaOut.Stats
	a.add(part{run: quiet(a.kafkaOut.Run), stop: stopBus, close: noErr(a.kafkaOut.Close), publish: a.kafkaOut,
		check: httpapi.Check{Name: "kafka", Shared: true, Check: a.kafkaOut.Ping}})
	return nil
}

// openIngest opens, with NATS and unless NoIngest, the consumer of
// session events of another connection layer (JetStream). It stops
// before the tracker, which it drives.
func (a *App) openIngest(ctx context.Context) error {
	if a.cfg.NATSURL == "" || a.cfg.NoIngest {
		return nil
	}
	var tr ingest.Tracker = a.edge
	if a.beacon != nil { // and Redis: the node owns devices
		r, err := ingestroute.New(ingestroute.Config{Conn: a.nats, Tracker: a.edge, Lease: a.tracker.LeaseID, Live: a.beacon.Live,
			Logger: a.cfg.Logger.With("component", "ingest-route")})
		if err != nil {
			return err
		}
		a.stats.IngestRoute = r.Stats
		// Stopped with the consumers: what is forwarded to it after is
		// applied by its sender.
		a.add(part{run: r.Run, stop: stopIngest})
		tr = r
	}
	c, err := ingest.Open(ctx, ingest.Config{
		Conn:    a.nats,
		Tracker: tr,
		Clock:   a.cfg.Clock,
		TTL:     a.cfg.TTL,
		Logger:  a.cfg.Logger.With("component", "ingest"),
	})
	if err != nil {
		return fmt.Errorf("open the ingest consumer: %w", err)
	}
	a.stats.Ingest = c.Stats
	a.add(part{run: c.Run, stop: stopIngest, close: c.Close})
	return nil
}

// openKafkaIn opens, with Kafka and unless NoKafkaIngest, the consumer of
// session events on the ingest topic. Like the JetStream ingest it stops
// before the tracker, leaving the group: its partitions move to the other
// nodes at once.
func (a *App) openKafkaIn(context.Context) error {
	if len(a.cfg.KafkaBrokers) == 0 || a.cfg.NoKafkaIngest {
		return nil
	}
	c, err := kafka.NewConsumer(kafka.ConsumerConfig{
		Brokers:  a.cfg.KafkaBrokers,
		Topic:    a.cfg.KafkaIngestTopic,
		Group:    a.cfg.KafkaGroup,
		ClientID: a.kafkaClientID(),
		Tracker:  a.edge,
		// With Redis the node owns the devices of the partitions it
		// consumes: their beats cost Redis nothing but claims and touches.
		Owner:  a.edge,
		TTL:    a.cfg.TTL,
		Clock:  a.cfg.Clock,
		Logger: a.cfg.Logger.With("component", "kafka-ingest"),
		// A dead node's partitions move within a third of the ttl
		// (at least the brokers' default minimum, 6s), before the
		// devices of its users expire.
		SessionTimeout: min(max(a.cfg.TTL/3, 6*time.Second), 10*time.Second),
	})
	if err != nil {
		return err
	}
	a.stats.KafkaIngest, a.stats.KafkaIngestTopic = c.Stats, a.cfg.KafkaIngestTopic
	p := part{run: c.Run, stop: stopIngest, close: c.Close}
	if a.kafkaOut == nil { // Kafka is checked once: through the producer when there is one
		p.check = httpapi.Check{Name: "kafka", Shared: true, Check: c.Ping}
	}
	a.add(p)
	return nil
}

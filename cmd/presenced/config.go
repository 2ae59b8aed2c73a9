package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/origin"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tlscert"
)

// devAddr is where a node under -dev listens unless told otherwise: an
// insecure node listens on loopback.
const devAddr = "127.0.0.1:8080"

// logger is the node's logger, as -log-level and -log-format say.
func (o *options) logger(stderr io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, fmt.Errorf("-log-level: %v", err)
	}
	switch o.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})), nil
	case "json":
		return slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})), nil
	}
	return nil, fmt.Errorf("-log-format %q: text or json", o.logFormat)
}

// config is the node's Config as the flags say, checked before anything
// is written to the data directory; the credentials come later
// (credentials). An error names the flag at fault.
func (o *options) config(log *slog.Logger) (app.Config, error) {
	c := o.cfg
	c.Logger = log
	if c.PollInterval == 0 {
		c.PollInterval = -1 // -poll-interval 0 disables; Config's zero is the default
	}
	if c.Dev && !o.set("addr") {
		c.Addr = devAddr
	}
	if err := o.checkLimits(&c); err != nil {
		return c, err
	}
	if err := o.checkEdges(&c, log); err != nil {
		return c, err
	}
	c.WebhookSecret = []byte(o.webhookSecret)
	c.NoKafkaIngest, c.NoKafkaChanges = c.KafkaIngestTopic == "", c.KafkaChangesTopic == ""
	if len(c.KafkaBrokers) > 0 && c.KafkaGroup == "" {
		return c, errors.New("-kafka-group: give the consumer group's name")
	}
	if c.RedisURL != "" && !c.Dev && (o.apiKey == "" || o.jwtSecret == "") && o.printToken == "" {
		return c, errors.New("-redis-url: give -api-key and -jwt-secret (or their environment variables): every node must accept the same credentials")
	}
	if err := c.ValidateTiming(); err != nil {
		return c, err
	}
	_, err := c.ConnCaps()
	return c, err
}

// checkLimits checks the caps a node enforces and turns the connection
// caps' flags into Config's: a given 0 is no cap (-1), as is the
// per-address cap under -dev, where every client is this machine.
func (o *options) checkLimits(c *app.Config) error {
	if c.MaxDevices < 1 || c.MaxDevices > presence.MaxMaxDevices {
		return fmt.Errorf("-max-devices %d: between 1 and %d", c.MaxDevices, presence.MaxMaxDevices)
	}
	if c.MaxRooms < 1 || c.MaxRooms > presence.MaxMaxRooms {
		return fmt.Errorf("-max-rooms %d: between 1 and %d", c.MaxRooms, presence.MaxMaxRooms)
	}
	if c.MaxSubscriptions < 1 {
		return fmt.Errorf("-max-subscriptions %d: at least 1", c.MaxSubscriptions)
	}
	if c.MaxWatchedRooms < 1 {
		return fmt.Errorf("-max-watched-rooms %d: at least 1", c.MaxWatchedRooms)
	}
	if c.RoomIntervalAbove < 10 {
		return fmt.Errorf("-room-interval-above %d: at least 10", c.RoomIntervalAbove)
	}
	if c.RoomInterval < 100*time.Millisecond || c.RoomInterval > time.Minute {
		return fmt.Errorf("-room-interval %v: from 100ms to 1m", c.RoomInterval)
	}
	userSubs := c.MaxUserSubscriptions
	if userSubs == 0 {
		userSubs = c.MaxSubscriptions // its default is a multiple of it
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"max-user-subscriptions", userSubs}, {"max-sockets-per-user", c.MaxSocketsPerUser}, {"max-sockets-per-device", c.MaxSocketsPerDevice}} {
		if f.v < 1 {
			return fmt.Errorf("-%s %d: at least 1", f.name, f.v)
		}
	}
	if userSubs < c.MaxSubscriptions {
		return fmt.Errorf("-max-user-subscriptions %d is below -max-subscriptions %d: one connection could not use its own cap", userSubs, c.MaxSubscriptions)
	}
	if c.FanoutAsyncThreshold < 1 {
		return fmt.Errorf("-fanout-async-threshold %d: at least 1", c.FanoutAsyncThreshold)
	}
	for _, f := range []struct {
		name string
		v    *int
	}{{"max-conns", &c.MaxConns}, {"max-conns-per-ip", &c.MaxConnsPerAddr}, {"max-pending-conns", &c.MaxPendingConns}} {
		switch {
		case *f.v < 0:
			return fmt.Errorf("-%s %d: 0 (no cap) or more", f.name, *f.v)
		case *f.v == 0 && o.set(f.name):
			*f.v = -1
		}
	}
	if c.Dev && !o.set("max-conns-per-ip") {
		c.MaxConnsPerAddr = -1
	}
	if c.HeaderTimeout < 100*time.Millisecond {
		return fmt.Errorf("-header-timeout %s: at least 100ms", c.HeaderTimeout)
	}
	if c.MaxHeaderBytes < 4096 {
		return fmt.Errorf("-max-header-bytes %d: at least 4096", c.MaxHeaderBytes)
	}
	if c.MaxTokenLifetime < time.Second {
		return fmt.Errorf("-max-token-lifetime %s: at least 1s", c.MaxTokenLifetime)
	}
	return nil
}

// checkEdges checks the TLS pair (loaded now, and again by the node),
// the allowed origins and Host names, and warns of the wide ones.
func (o *options) checkEdges(c *app.Config, log *slog.Logger) error {
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("-tls-cert and -tls-key go together: give both, or neither for plain HTTP")
	}
	if c.TLSCertFile != "" && o.printToken == "" {
		if _, err := tlscert.Load(c.TLSCertFile, c.TLSKeyFile, nil); err != nil {
			return fmt.Errorf("-tls-cert/-tls-key: %w", err)
		}
	}
	origins, err := origin.Parse(c.AllowedOrigins)
	if err != nil {
		return fmt.Errorf("-allowed-origins: %v", err)
	}
	if origins.Any() {
		log.Warn("-allowed-origins *: pages of every origin may call this node")
	}
	if _, err := origin.NewHosts(origin.HostConfig{Allowed: c.AllowedHosts}); err != nil {
		return fmt.Errorf("-allowed-hosts: %v", err)
	}
	if slices.Contains(c.AllowedHosts, "*") && c.Dev {
		log.Warn("-allowed-hosts * under -dev: a page whose name is pointed at this node's address (DNS rebinding) may act for anybody")
	}
	return nil
}

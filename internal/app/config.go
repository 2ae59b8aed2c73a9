package app

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"time"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/connbudget"
	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/httpapi"
	"github.com/presenced/presenced/internal/kafka"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/redisstore"
)

// Config is the configuration of one node. A zero field takes its value
// from Defaults; cmd/presenced fills it from flags and the environment,
// whose defaults are Defaults too.
type Config struct {
	Addr         string        // listen address
	DataDir      string        // embedded state
	TTL          time.Duration // heartbeat ttl
	IdleAfter    time.Duration // online → away
	CloseGrace   time.Duration // a WebSocket closed without bye: offline after this unless it reconnects; cut to TTL (= its whole ttl); presence.NoCloseGrace: offline at once
	PollInterval time.Duration // client HTTP read throttle; negative disables
	MaxDevices   int           // alive devices per user
	MaxRooms     int           // rooms one device is in at once
	// APIKey and JWTSecret are the credentials (auth.Config); outside Dev
	// each set one must be at least auth.MinSecretLen (32) bytes long.
	APIKey    string
	JWTSecret []byte
	Dev       bool
	// MaxTokenLifetime refuses client tokens valid for longer
	// (auth.Config.MaxLifetime).
	MaxTokenLifetime time.Duration
	// TokenAudience and TokenIssuer, when set, are required of client
	// tokens' aud and iss (auth.Config). Empty: not checked.
	TokenAudience string
	TokenIssuer   string
	Logger        *slog.Logger
	Clock         clock.Clock
	// ShutdownTimeout bounds the graceful stop of HTTP requests.
	ShutdownTimeout time.Duration
	// SweepInterval and FlushInterval tune the tracker (zero: the
	// tracker's defaults).
	SweepInterval time.Duration
	FlushInterval time.Duration
	// MaxSubscriptions caps the users one WebSocket watches.
	MaxSubscriptions int
	// MaxUserSubscriptions caps the users one user watches across all
	// their WebSockets to this node (zero: 10 × MaxSubscriptions);
	// MaxSocketsPerUser and MaxSocketsPerDevice their open WebSockets.
	MaxUserSubscriptions int
	MaxSocketsPerUser    int
	MaxSocketsPerDevice  int
	// MaxWatchedRooms caps the rooms one WebSocket watches.
	MaxWatchedRooms int
	// RoomIntervalAbove is the count of members above which a room's
	// watchers get one message per RoomInterval instead of one per
	// change (fanout.RoomConfig).
	RoomIntervalAbove int
	RoomInterval      time.Duration
	// FanoutAsyncThreshold is the number of watchers above which a user's
	// changes take the batched fan-out path.
	FanoutAsyncThreshold int

	// Scale-out backends (docs/operations.md). Empty: the embedded
	// default. RedisURL needs PostgresURL (nodes sharing hot state must
	// share their durable store too).
	RedisURL    string // hot state in Redis / Redis Cluster
	RedisPrefix string // key prefix
	// RedisBuckets is the number of hashes each Redis shard packs its
	// users in at first (redisstore.Config.Buckets: a shard adds more as
	// it grows). 0: the number Redis recorded, else
	// redisstore.DefaultBuckets. Every node of a deployment must use the
	// same.
	RedisBuckets int
	PostgresURL  string // durable store in PostgreSQL instead of SQLite
	NATSURL      string // cross-node bus, presence.changes stream, ingest consumer
	NodeID       string // this node's name on the bus, default: random
	// NoIngest turns the JetStream ingest consumer off (it runs by default
	// when NATSURL is set).
	NoIngest bool
	// ReadReplica keeps, in this node, every user's public status,
	// settings and version (package replica, fed by every change on the
	// bus), and answers the seed's status-only batch read from it; needs
	// RedisURL and NATSURL.
	ReadReplica bool
	// ReadReplicaUsers bounds the read replica of a node with Redis and
	// NATS and no ReadReplica to about this many users: those read and
	// changed lately, read from Redis on a miss (replica.Config.Max).
	// Zero takes DefaultReadReplicaUsers; a negative value: no replica.
	ReadReplicaUsers int

	// Connections (package connbudget): caps on the open connections
	// overall, per source address, and of those not done sending a
	// request. Zero takes the default (ConnCaps); a negative value is no
	// cap.
	MaxConns        int
	MaxConnsPerAddr int
	MaxPendingConns int
	// HeaderTimeout bounds reading a request's line and headers;
	// MaxHeaderBytes their size (beyond it, 431).
	HeaderTimeout  time.Duration
	MaxHeaderBytes int
	// WebhookURLs receive every change (package webhook), signed with
	// WebhookSecret (required with them; 32 bytes or more outside -dev).
	// They are delivered from a durable log: the NATS stream with NATSURL,
	// else the outbox in the SQLite file — PostgreSQL without NATS has
	// none, and is refused.
	WebhookURLs   []string
	WebhookSecret []byte
	// KafkaBrokers (host:port, one or more) turn Kafka on (package
	// kafka), independently of NATS: the consumer of session events on
	// KafkaIngestTopic in the consumer group KafkaGroup, and the producer
	// of every change this node makes to KafkaChangesTopic.
	// NoKafkaIngest and NoKafkaChanges turn either off.
	KafkaBrokers      []string
	KafkaIngestTopic  string
	KafkaGroup        string
	KafkaChangesTopic string
	NoKafkaIngest     bool
	NoKafkaChanges    bool
	// HealthAddr, when set, serves /healthz, /readyz and /metrics on a
	// listener of their own, outside the clients' connection budget.
	HealthAddr string
	// AllowedOrigins are the origins of the browser pages, besides the
	// node's own, that may open WebSockets and call the client endpoints
	// (package origin: https://app.example.com, https://*.example.com,
	// or *). Empty: the node's own pages only.
	AllowedOrigins []string
	// AllowedHosts are the Host names the node answers to besides IP
	// addresses and localhost (package origin, Hosts: presence.example.com,
	// *.example.com, or *). Empty: every name, unless the node is local
	// (Dev, or a loopback listener), which then takes only its listen
	// host. /healthz and /readyz answer every Host.
	AllowedHosts []string
	// TLSCertFile and TLSKeyFile, set together, make the clients' listener
	// serve HTTPS and WSS with this certificate (package tlscert), loaded
	// again by ReloadTLS. The health listener (HealthAddr) stays plain
	// HTTP. Empty: plain HTTP (TLS ended by a proxy in front).
	TLSCertFile string
	TLSKeyFile  string
}

// DefaultMaxHeaderBytes bounds a request's line and headers: a GET
// /presence/batch of 1,000 ids of up to 31 bytes; more ids, or longer, go
// in the body of POST /v1/presence/batch.
const DefaultMaxHeaderBytes = 32 << 10

// Defaults returns the values New gives the zero fields of a Config, and
// cmd/presenced its flags: the one place a default of the node is set
// (most name the constant of the package they configure). MaxConns is
// the process's file limit less a reserve (connbudget.Defaults); the
// zero MaxConnsPerAddr, MaxPendingConns (shares of MaxConns: ConnCaps)
// and MaxUserSubscriptions (10 × MaxSubscriptions) are derived.
func Defaults() Config {
	return Config{
		Addr:                 ":8080",
		DataDir:              "./data",
		TTL:                  presence.DefaultTTL,
		IdleAfter:            presence.DefaultIdleAfter,
		CloseGrace:           presence.DefaultCloseGrace,
		PollInterval:         httpapi.DefaultPollInterval,
		MaxDevices:           presence.DefaultMaxDevices,
		MaxRooms:             presence.DefaultMaxRooms,
		MaxWatchedRooms:      fanout.DefaultMaxWatchedRooms,
		RoomIntervalAbove:    fanout.DefaultIntervalAbove,
		RoomInterval:         fanout.DefaultInterval,
		MaxTokenLifetime:     auth.DefaultMaxLifetime,
		Logger:               slog.New(slog.DiscardHandler),
		Clock:                clock.Real{},
		ShutdownTimeout:      10 * time.Second,
		MaxSubscriptions:     presence.DefaultMaxSubscriptions,
		MaxSocketsPerUser:    gateway.DefaultMaxSocketsPerUser,
		MaxSocketsPerDevice:  gateway.DefaultMaxSocketsPerDevice,
		FanoutAsyncThreshold: fanout.DefaultAsyncThreshold,
		RedisPrefix:          redisstore.DefaultPrefix,
		MaxConns:             connbudget.Defaults(connbudget.FileLimit()).Max,
		HeaderTimeout:        5 * time.Second,
		MaxHeaderBytes:       DefaultMaxHeaderBytes,
		KafkaIngestTopic:     kafka.DefaultIngestTopic,
		KafkaGroup:           kafka.DefaultGroup,
		KafkaChangesTopic:    kafka.DefaultChangesTopic,
		ReadReplicaUsers:     DefaultReadReplicaUsers,
	}
}

// DefaultReadReplicaUsers is the default bound of a scale-out node's
// read replica (its heap when full: operations.md, "The read replica").
const DefaultReadReplicaUsers = 1_000_000

// defaults checks c and fills its zero fields from Defaults.
func (c *Config) defaults() error {
	if err := c.validate(); err != nil {
		return err
	}
	caps, _ := c.ConnCaps() // checked by validate
	c.MaxConns, c.MaxConnsPerAddr, c.MaxPendingConns = caps.Max, caps.PerAddr, caps.Pending
	d := Defaults()
	orDefault(&c.Addr, d.Addr)
	orDefault(&c.DataDir, d.DataDir)
	orDefault(&c.TTL, d.TTL)
	orDefault(&c.ReadReplicaUsers, d.ReadReplicaUsers)
	orDefault(&c.IdleAfter, d.IdleAfter)
	if c.CloseGrace == 0 { // presence.NoCloseGrace: off
		c.CloseGrace = d.CloseGrace
	}
	if c.PollInterval == 0 { // negative: no throttle
		c.PollInterval = d.PollInterval
	}
	orDefault(&c.MaxDevices, d.MaxDevices)
	orDefault(&c.MaxRooms, d.MaxRooms)
	orDefault(&c.MaxWatchedRooms, d.MaxWatchedRooms)
	orDefault(&c.RoomIntervalAbove, d.RoomIntervalAbove)
	orDefault(&c.RoomInterval, d.RoomInterval)
	orDefault(&c.MaxTokenLifetime, d.MaxTokenLifetime)
	c.Logger = cmp.Or(c.Logger, d.Logger)
	c.Clock = cmp.Or(c.Clock, d.Clock)
	orDefault(&c.ShutdownTimeout, d.ShutdownTimeout)
	orDefault(&c.MaxSubscriptions, d.MaxSubscriptions)
	orDefault(&c.MaxSocketsPerUser, d.MaxSocketsPerUser)
	orDefault(&c.MaxSocketsPerDevice, d.MaxSocketsPerDevice)
	orDefault(&c.FanoutAsyncThreshold, d.FanoutAsyncThreshold)
	orDefault(&c.RedisPrefix, d.RedisPrefix)
	orDefault(&c.HeaderTimeout, d.HeaderTimeout)
	orDefault(&c.MaxHeaderBytes, d.MaxHeaderBytes)
	orDefault(&c.KafkaIngestTopic, d.KafkaIngestTopic)
	orDefault(&c.KafkaGroup, d.KafkaGroup)
	orDefault(&c.KafkaChangesTopic, d.KafkaChangesTopic)
	return nil
}

// orDefault sets *v to def where *v is zero or, a number, negative: the
// negative values validate lets through mean the default too.
func orDefault[T cmp.Ordered](v *T, def T) {
	var zero T
	if *v <= zero {
		*v = def
	}
}

// validate checks c as given, zero fields meaning their defaults.
func (c *Config) validate() error {
	if err := c.ValidateTiming(); err != nil {
		return err
	}
	if _, err := c.ConnCaps(); err != nil {
		return err
	}
	for _, check := range []func() error{c.validateAuth, c.validateWebhooks, c.validateBackends} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validateAuth checks the credentials: some way to authenticate, and
// secrets long enough outside Dev.
func (c *Config) validateAuth() error {
	if c.APIKey == "" && len(c.JWTSecret) == 0 && !c.Dev {
		return errors.New("no way to authenticate: set an API key, a JWT secret, or development mode")
	}
	if c.Dev {
		return nil
	}
	if c.APIKey != "" {
		if err := auth.CheckSecret([]byte(c.APIKey)); err != nil {
			return fmt.Errorf("API key: %w", err)
		}
	}
	if len(c.JWTSecret) > 0 {
		if err := auth.CheckSecret(c.JWTSecret); err != nil {
			return fmt.Errorf("JWT secret: %w", err)
		}
	}
	return nil
}

// validateWebhooks checks the webhooks' URLs, their secret, and that a
// durable log feeds them.
func (c *Config) validateWebhooks() error {
	for _, u := range c.WebhookURLs {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return fmt.Errorf("webhook URL %q: want http(s)://host/path", u)
		}
	}
	if len(c.WebhookURLs) == 0 {
		return nil
	}
	if len(c.WebhookSecret) == 0 {
		return errors.New("webhook URLs need a webhook secret to sign with")
	}
	if err := auth.CheckSecret(c.WebhookSecret); err != nil && !c.Dev {
		return fmt.Errorf("webhook secret: %w", err)
	}
	if c.PostgresURL != "" && c.NATSURL == "" {
		return errors.New("webhooks with PostgreSQL need NATS (-nats-url): they are delivered from the durable stream of changes " +
			"(the embedded node, with SQLite, keeps them in an outbox in its file instead)")
	}
	return nil
}

// validateBackends checks the scale-out backends, Kafka's brokers and
// the token lifetime.
func (c *Config) validateBackends() error {
	if c.RedisBuckets < 0 || c.RedisBuckets > maxRedisBuckets {
		return fmt.Errorf("redis buckets %d: want 1 to %d a shard (0: the number Redis recorded, else %d)", c.RedisBuckets, maxRedisBuckets, redisstore.DefaultBuckets)
	}
	if c.ReadReplica && (c.RedisURL == "" || c.NATSURL == "") {
		return errors.New("a read replica needs Redis and NATS (-redis-url, -nats-url): an embedded node reads its own memory already")
	}
	for _, b := range c.KafkaBrokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			return fmt.Errorf("kafka broker %q: want host:port", b)
		}
	}
	if c.MaxTokenLifetime < 0 {
		return fmt.Errorf("maximum token lifetime %s is negative", c.MaxTokenLifetime)
	}
	if c.RedisURL != "" && c.PostgresURL == "" {
		return errors.New("a Redis URL needs a PostgreSQL URL too: nodes that share hot state must share their durable store")
	}
	return nil
}

// Mode names the backends of the node, for its logs.
func (c *Config) Mode() string {
	if c.RedisURL == "" && c.PostgresURL == "" && c.NATSURL == "" {
		if len(c.KafkaBrokers) > 0 {
			return "embedded+kafka"
		}
		return "embedded"
	}
	m := "memory"
	if c.RedisURL != "" {
		m = "redis"
	}
	if c.PostgresURL != "" {
		m += "+postgres"
	} else {
		m += "+sqlite"
	}
	if c.NATSURL != "" {
		m += "+nats"
	}
	if len(c.KafkaBrokers) > 0 {
		m += "+kafka"
	}
	return m
}

// maxRedisBuckets bounds Config.RedisBuckets: 256 shards of a million
// buckets hold 32 billion users at 128 a bucket.
const maxRedisBuckets = 1 << 20

// ValidateTiming checks the durations of the state model; zero means the
// default.
func (c *Config) ValidateTiming() error {
	if c.TTL != 0 && c.TTL < time.Second {
		return fmt.Errorf("heartbeat ttl %s is too short: at least 1s", c.TTL)
	}
	if c.IdleAfter != 0 && c.IdleAfter < time.Second {
		return fmt.Errorf("idle-after %s is too short: at least 1s", c.IdleAfter)
	}
	if c.CloseGrace < 0 && c.CloseGrace != presence.NoCloseGrace {
		return fmt.Errorf("close grace %s is negative (presence.NoCloseGrace turns it off)", c.CloseGrace)
	}
	return nil
}

// ConnCaps returns the connection caps in force: MaxConns, or by default
// Defaults' (the process's file limit less a reserve); the per-address
// and pending caps, or by default their shares of that MaxConns
// (connbudget.ForMax; with no overall cap, of the file limit's default).
// A cap of 0 in the result is no cap. A per-address or pending cap above
// MaxConns is an error.
func (c *Config) ConnCaps() (connbudget.Config, error) {
	def := connbudget.Defaults(connbudget.FileLimit())
	caps := connbudget.Config{Max: c.MaxConns, PerAddr: c.MaxConnsPerAddr, Pending: c.MaxPendingConns}
	if caps.Max == 0 {
		caps.Max = Defaults().MaxConns
	}
	if caps.Max > 0 {
		def = connbudget.ForMax(caps.Max)
	}
	for _, lim := range []struct {
		v   *int
		def int
	}{{&caps.Max, 0}, {&caps.PerAddr, def.PerAddr}, {&caps.Pending, def.Pending}} {
		switch {
		case *lim.v == 0:
			*lim.v = lim.def
		case *lim.v < 0:
			*lim.v = 0 // no cap
		}
	}
	if caps.Max > 0 {
		if caps.PerAddr > caps.Max {
			return caps, fmt.Errorf("connections per address %d (-max-conns-per-ip) above the %d of the node (-max-conns): one address could never use its cap", caps.PerAddr, caps.Max)
		}
		if caps.Pending > caps.Max {
			return caps, fmt.Errorf("pending connections %d (-max-pending-conns) above the %d of the node (-max-conns)", caps.Pending, caps.Max)
		}
	}
	return caps, nil
}

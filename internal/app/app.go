// Package app wires one presenced node from its parts — state store,
// durable store, tracker, reader, fan-out hub, HTTP API, WebSocket gateway —
// runs it, and shuts it down in reverse order of opening, flushing durable
// state last.
package app

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/presenced/presenced/internal/apierr"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/beacon"
	"github.com/presenced/presenced/internal/clock"
	"github.com/presenced/presenced/internal/connbudget"
	"github.com/presenced/presenced/internal/fanout"
	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/httpapi"
	"github.com/presenced/presenced/internal/ingest"
	"github.com/presenced/presenced/internal/jsstream"
	"github.com/presenced/presenced/internal/kafka"
	"github.com/presenced/presenced/internal/memstore"
	"github.com/presenced/presenced/internal/metrics"
	"github.com/presenced/presenced/internal/natsbus"
	"github.com/presenced/presenced/internal/origin"
	"github.com/presenced/presenced/internal/peers"
	"github.com/presenced/presenced/internal/pgstore"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/query"
	"github.com/presenced/presenced/internal/ratelimit"
	"github.com/presenced/presenced/internal/redisstore"
	"github.com/presenced/presenced/internal/replica"
	"github.com/presenced/presenced/internal/sqlitestore"
	"github.com/presenced/presenced/internal/tlscert"
	"github.com/presenced/presenced/internal/tracker"
	"github.com/presenced/presenced/internal/web"
	"github.com/presenced/presenced/internal/webhook"
	"github.com/presenced/presenced/internal/wsaccept"
)

// Config is the configuration of one node. Zero values take the documented
// defaults; cmd/presenced fills it from flags and the environment.
type Config struct {
	Addr         string        // listen address, default ":8080"
	DataDir      string        // embedded state, default "./data"
	TTL          time.Duration // heartbeat ttl, default 30s
	IdleAfter    time.Duration // online → away, default 5m
	CloseGrace   time.Duration // a WebSocket closed without bye: offline after this unless it reconnects; default 5s, cut to TTL (= off)
	PollInterval time.Duration // client HTTP read throttle, default 30s; negative disables
	MaxDevices   int           // alive devices per user, default 32
	// APIKey and JWTSecret are the credentials (auth.Config); outside Dev
	// each set one must be at least auth.MinSecretLen (32) bytes long.
	APIKey    string
	JWTSecret []byte
	Dev       bool
	// MaxTokenLifetime refuses client tokens valid for longer
	// (auth.Config.MaxLifetime). Default 24h.
	MaxTokenLifetime time.Duration
	// TokenAudience and TokenIssuer, when set, are required of client
	// tokens' aud and iss (auth.Config). Empty: not checked.
	TokenAudience string
	TokenIssuer   string
	Logger        *slog.Logger
	Clock         clock.Clock
	// ShutdownTimeout bounds the graceful stop of HTTP requests. Default 10s.
	ShutdownTimeout time.Duration
	// SweepInterval and FlushInterval tune the tracker (defaults 100ms, 1s).
	SweepInterval time.Duration
	FlushInterval time.Duration
	// MaxSubscriptions caps the users one WebSocket watches. Default 500.
	MaxSubscriptions int
	// MaxUserSubscriptions caps the users one user watches across all
	// their WebSockets to this node (default 10 × MaxSubscriptions);
	// MaxSocketsPerUser and MaxSocketsPerDevice their open WebSockets
	// (defaults 64 and 8).
	MaxUserSubscriptions int
	MaxSocketsPerUser    int
	MaxSocketsPerDevice  int
	// FanoutAsyncThreshold is the number of watchers above which a user's
	// changes take the batched fan-out path. Default 10,000.
	FanoutAsyncThreshold int

	// Scale-out backends (docs/operations.md). Empty: the embedded
	// default. RedisURL needs PostgresURL (nodes sharing hot state must
	// share their durable store too).
	RedisURL    string // hot state in Redis / Redis Cluster
	RedisPrefix string // key prefix, default "presenced:"
	// RedisBuckets is the number of hashes each Redis shard packs its
	// users in (redisstore.Config.Buckets): users held / 256 / 64, default
	// 64. Every node of a deployment must use the same.
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

	// Connections (package connbudget): caps on the open connections
	// overall, per source address, and of those not done sending a
	// request. Zero takes the default (ConnCaps); a negative value is no
	// cap.
	MaxConns        int
	MaxConnsPerAddr int
	MaxPendingConns int
	// HeaderTimeout bounds reading a request's line and headers (default
	// 5s); MaxHeaderBytes their size (default 32 KiB; beyond it, 431).
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
	// KafkaIngestTopic (default "presence.updates") in the consumer group
	// KafkaGroup (default "presenced"), and the producer of every change
	// this node makes to KafkaChangesTopic (default "presence.changes").
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

// edgeTracker is the tracker as the edges and the ingest consumers are
// given it: the tracker itself, or with webhooks confirming (confirm.go).
type edgeTracker interface {
	httpapi.Tracker
	httpapi.HeartbeatReader
	gateway.Tracker
	ingest.Tracker
}

var _ edgeTracker = confirming{}

// durableStore is what a node needs of its durable store (sqlitestore or
// pgstore).
type durableStore interface {
	tracker.Durable
	httpapi.ContactBook
	fanout.Relations
	NextEpoch(ctx context.Context) (uint64, error)
	Ping(ctx context.Context) error
	Close() error
}

// App is one running node.
type App struct {
	cfg     Config
	rules   presence.Rules
	log     *slog.Logger
	durable durableStore
	store   tracker.Store
	redis   rueidis.Client   // nil: embedded hot state
	nats    *jsstream.Conn   // nil without NATS: the one connection of bus and ingest
	bus     *natsbus.Bus     // nil without NATS
	beacon  *beacon.Beacon   // nil without NATS or Redis: node liveness apart from Redis
	peers   *peers.Peers     // nil without NATS or Redis: what other nodes hold of devices, for degraded reads
	replica *replica.Replica // nil without ReadReplica
	// replicaDeaf: another live node went unheard on the bus and the
	// replica refused; it is filled again once all are heard.
	replicaDeaf atomic.Bool
	// replicaReconnects is the NATS connection's reconnection count when
	// the bus last told of one (missedChanges).
	replicaReconnects atomic.Uint64
	ingest            *ingest.Consumer // nil without NATS or with NoIngest
	webhooks          *webhook.Sender  // nil without webhook URLs
	kafkaIn           *kafka.Consumer  // nil without Kafka or with NoKafkaIngest
	kafkaOut          *kafka.Producer  // nil without Kafka or with NoKafkaChanges
	tracker           *tracker.Tracker
	api               *httpapi.Server
	gw                *gateway.Gateway
	hub               *fanout.Hub
	handler           http.Handler
	metrics           *metrics.Registry
	budget            atomic.Pointer[connbudget.Listener] // set by Run before it serves
	accept            atomic.Pointer[wsaccept.Listener]   // set by Run before it serves
	cert              *tlscert.Store                      // nil: plain HTTP
	// hosts are the Host names the node answers to (origin.Hosts): set by
	// New from the configuration, and by Run from the address it listens on.
	hosts atomic.Pointer[origin.Hosts]

	reader   *query.Reader
	resync   *resyncer     // sends watchers the current state when asked
	contacts *contactRelay // hands changed contact lists to the hub

	closeOnce sync.Once
	closeErr  error
}

func (c *Config) defaults() error {
	if c.Addr == "" {
		c.Addr = ":8080"
	}
	if c.DataDir == "" {
		c.DataDir = "./data"
	}
	if c.TTL == 0 {
		c.TTL = presence.DefaultTTL
	}
	if c.IdleAfter == 0 {
		c.IdleAfter = presence.DefaultIdleAfter
	}
	if err := c.ValidateTiming(); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.MaxSubscriptions <= 0 {
		c.MaxSubscriptions = presence.DefaultMaxSubscriptions
	}
	if c.FanoutAsyncThreshold <= 0 {
		c.FanoutAsyncThreshold = 10000
	}
	caps, err := c.ConnCaps()
	if err != nil {
		return err
	}
	c.MaxConns, c.MaxConnsPerAddr, c.MaxPendingConns = caps.Max, caps.PerAddr, caps.Pending
	if c.HeaderTimeout <= 0 {
		c.HeaderTimeout = 5 * time.Second
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.APIKey == "" && len(c.JWTSecret) == 0 && !c.Dev {
		return errors.New("no way to authenticate: set an API key, a JWT secret, or development mode")
	}
	if !c.Dev {
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
	}
	for _, u := range c.WebhookURLs {
		if pu, err := url.Parse(u); err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
			return fmt.Errorf("webhook URL %q: want http(s)://host/path", u)
		}
	}
	if len(c.WebhookURLs) > 0 {
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
	}
	if c.RedisBuckets < 0 || c.RedisBuckets > maxRedisBuckets {
		return fmt.Errorf("redis buckets %d: want 1 to %d a shard (0: the default, 64)", c.RedisBuckets, maxRedisBuckets)
	}
	if c.ReadReplica && (c.RedisURL == "" || c.NATSURL == "") {
		return errors.New("a read replica needs Redis and NATS (-redis-url, -nats-url): an embedded node reads its own memory already")
	}
	for _, b := range c.KafkaBrokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			return fmt.Errorf("kafka broker %q: want host:port", b)
		}
	}
	if c.KafkaIngestTopic == "" {
		c.KafkaIngestTopic = kafka.DefaultIngestTopic
	}
	if c.KafkaGroup == "" {
		c.KafkaGroup = kafka.DefaultGroup
	}
	if c.KafkaChangesTopic == "" {
		c.KafkaChangesTopic = kafka.DefaultChangesTopic
	}
	if c.MaxTokenLifetime < 0 {
		return fmt.Errorf("maximum token lifetime %s is negative", c.MaxTokenLifetime)
	}
	if c.MaxTokenLifetime == 0 {
		c.MaxTokenLifetime = auth.DefaultMaxLifetime
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
	if c.CloseGrace < 0 {
		return fmt.Errorf("close grace %s is negative", c.CloseGrace)
	}
	return nil
}

// ConnCaps returns the connection caps in force: MaxConns, or by default
// the process's file limit less a reserve (connbudget.Defaults); the
// per-address and pending caps, or by default their shares of that
// MaxConns (connbudget.ForMax; with no overall cap, of the file limit's
// default). A cap of 0 in the result is no cap. A per-address or pending
// cap above MaxConns is an error.
func (c *Config) ConnCaps() (connbudget.Config, error) {
	def := connbudget.Defaults(connbudget.FileLimit())
	caps := connbudget.Config{Max: c.MaxConns, PerAddr: c.MaxConnsPerAddr, Pending: c.MaxPendingConns}
	if caps.Max == 0 {
		caps.Max = def.Max
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

// New opens the stores and builds the node. Call Run to serve, or use
// Handler in tests; Close releases everything.
func New(ctx context.Context, cfg Config) (*App, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	origins, err := origin.Parse(cfg.AllowedOrigins)
	if err != nil {
		return nil, fmt.Errorf("allowed origins: %w", err)
	}
	a := &App{cfg: cfg, log: cfg.Logger, resync: newResyncer(cfg.Logger)}
	// The Host names as the configuration says; Run decides again from
	// the address it listens on.
	hosts, err := a.hostsFor(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("allowed hosts: %w", err)
	}
	a.hosts.Store(hosts)
	if cfg.TLSCertFile != "" || cfg.TLSKeyFile != "" {
		if a.cert, err = tlscert.Load(cfg.TLSCertFile, cfg.TLSKeyFile, cfg.Logger.With("component", "tls")); err != nil {
			return nil, err
		}
	}
	rules := presence.Rules{TTL: cfg.TTL, IdleAfter: cfg.IdleAfter, MaxDevices: cfg.MaxDevices, CloseGrace: cfg.CloseGrace}.WithDefaults()

	ok := false
	defer func() {
		if !ok {
			a.closeBackends()
		}
	}()
	durable, err := openDurable(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open durable store: %w", err)
	}
	a.durable = durable
	if rules.Epoch, err = durable.NextEpoch(ctx); err != nil {
		return nil, err
	}
	a.rules = rules
	var users func() int
	if cfg.RedisURL != "" {
		if a.redis, err = redisstore.Dial(cfg.RedisURL); err != nil {
			return nil, err
		}
		// Versions of this run start above every earlier run's, also for
		// users loaded into Redis (see redisstore's package doc).
		rs, err := redisstore.Open(ctx, a.redis, redisstore.Config{Rules: rules, Prefix: cfg.RedisPrefix, Buckets: cfg.RedisBuckets})
		if err != nil {
			return nil, err
		}
		a.store = rs
		if cfg.ReadReplica {
			if a.replica, err = replica.New(replica.Config{Source: rs, Fresh: a.replicaFresh,
				Logger: cfg.Logger.With("component", "replica")}); err != nil {
				return nil, err
			}
		}
	} else {
		ms := memstore.New(memstore.Config{Rules: rules})
		a.store, users = ms, ms.Len
	}
	a.hub, err = fanout.New(fanout.Config{
		Relations:        durable,
		MaxSubscriptions: cfg.MaxSubscriptions,
		AsyncThreshold:   cfg.FanoutAsyncThreshold,
		Logger:           cfg.Logger.With("component", "fanout"),
	})
	if err != nil {
		return nil, err
	}
	a.contacts = newContactRelay(durable, a.hub, a.userState, cfg.Logger) // a.tracker is set below, before Run
	onContacts := a.contacts.Changed                                      // a change made through this node's API
	var reloadMargin uint64
	if cfg.RedisURL != "" {
		reloadMargin = 1 << 16 // Redis may lose what the last checkpoint missed
	}
	pubs := publishers{logPublisher{cfg.Logger.With("component", "events")}, a.hub}
	if a.replica != nil {
		pubs = append(pubs, a.replica) // this node's changes at once; the others' come from the bus
	}
	hooks := webhook.Config{URLs: cfg.WebhookURLs, Secret: cfg.WebhookSecret, Clock: cfg.Clock,
		Logger: cfg.Logger.With("component", "webhook")}
	if len(cfg.WebhookURLs) > 0 && cfg.NATSURL == "" {
		// The embedded node: its changes go to the outbox in its SQLite
		// file (defaults refused PostgreSQL without NATS).
		if hooks.Outbox, _ = durable.(webhook.Outbox); hooks.Outbox == nil {
			return nil, errors.New("webhooks: the durable store keeps no outbox")
		}
		if a.webhooks, err = webhook.New(ctx, hooks); err != nil {
			return nil, err
		}
		pubs = append(pubs, a.webhooks)
	}
	kafkaClient := "presenced"
	if cfg.NodeID != "" {
		kafkaClient += "-" + cfg.NodeID
	}
	if len(cfg.KafkaBrokers) > 0 && !cfg.NoKafkaChanges {
		if a.kafkaOut, err = kafka.NewProducer(kafka.ProducerConfig{Brokers: cfg.KafkaBrokers, Topic: cfg.KafkaChangesTopic,
			ClientID: kafkaClient, Logger: cfg.Logger.With("component", "kafka-changes")}); err != nil {
			return nil, err
		}
		pubs = append(pubs, a.kafkaOut) // this node's changes only: each change is produced by one node
	}
	if cfg.NATSURL != "" {
		name := "presenced"
		if cfg.NodeID != "" {
			name += " " + cfg.NodeID
		}
		if a.nats, err = jsstream.Dial(cfg.NATSURL, name, cfg.Logger.With("component", "nats"), natsbus.JetStreamOptions()...); err != nil {
			return nil, err
		}
		a.bus, err = natsbus.Open(ctx, natsbus.Config{
			Conn:              a.nats,
			NodeID:            cfg.NodeID,
			Local:             a.hub,
			OnContactsChanged: a.contacts.Changed, // another node's change: not announced again
			OnReconnect:       a.missedChanges,
			Mirror:            replicaMirror(a.replica),
			OnMirrorLost:      a.mirrorLost,
			Logger:            cfg.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("open the NATS bus: %w", err)
		}
		a.hub.SetInterest(a.bus) // the bus subscribes to what the hub's watchers watch
		pubs = append(pubs, a.bus)
		if len(cfg.WebhookURLs) > 0 {
			// Delivered from the stream the bus publishes every change to,
			// by one node at a time per URL.
			hooks.Stream = &webhook.StreamConfig{Conn: a.nats, Stream: a.bus.StreamName(), Confirmer: a.bus, NodeID: a.bus.NodeID()}
			if a.webhooks, err = webhook.New(ctx, hooks); err != nil {
				return nil, fmt.Errorf("webhooks on the NATS stream: %w", err)
			}
		}
		if cfg.RedisURL != "" {
			// Nodes cut off from Redis only keep their devices: their
			// beacons on NATS keep the others from taking them over.
			if a.beacon, err = beacon.New(beacon.Config{
				Conn:     a.nats,
				Interval: tracker.DefaultLeaseInterval(rules.TTL),
				Timeout:  tracker.DefaultLeaseTimeout(rules.TTL),
				Name:     a.bus.NodeID(), // -node-id, or the bus's random one
				Clock:    cfg.Clock,
				Logger:   cfg.Logger.With("component", "beacon"),
			}); err != nil {
				return nil, fmt.Errorf("node beacon on NATS: %w", err)
			}
			// A degraded read asks the other nodes what they hold of
			// its users' devices.
			if a.peers, err = peers.New(peers.Config{
				Conn:   a.nats,
				Live:   a.beacon.Live,
				Clock:  cfg.Clock,
				Logger: cfg.Logger.With("component", "peers"),
			}); err != nil {
				return nil, err
			}
		}
		onContacts = func(owner string) {
			a.contacts.Changed(owner)
			a.bus.ContactsChanged(owner) // other nodes read the list again
		}
	}
	a.tracker, err = tracker.New(tracker.Config{
		Store:         a.store,
		Durable:       durable,
		Publisher:     pubs,
		Rules:         rules,
		OnRecover:     a.storeRecovered,
		NodeAlive:     nodeAlive(a.beacon),
		Peers:         trackerPeers(a.peers),
		ReloadMargin:  reloadMargin,
		Clock:         cfg.Clock,
		Logger:        cfg.Logger.With("component", "tracker"),
		SweepInterval: cfg.SweepInterval,
		FlushInterval: cfg.FlushInterval,
	})
	if err != nil {
		return nil, err
	}
	// What the edges and the ingest consumers change, with webhooks,
	// waits for the webhooks' log before it is acknowledged.
	var edge edgeTracker = a.tracker
	if a.webhooks != nil {
		edge = confirming{a.tracker, a.webhooks}
	}
	if cfg.NATSURL != "" && !cfg.NoIngest {
		a.ingest, err = ingest.Open(ctx, ingest.Config{
			Conn:    a.nats,
			Tracker: edge,
			Clock:   cfg.Clock,
			TTL:     cfg.TTL,
			Logger:  cfg.Logger.With("component", "ingest"),
		})
		if err != nil {
			return nil, fmt.Errorf("open the ingest consumer: %w", err)
		}
	}
	if len(cfg.KafkaBrokers) > 0 && !cfg.NoKafkaIngest {
		a.kafkaIn, err = kafka.NewConsumer(kafka.ConsumerConfig{
			Brokers:  cfg.KafkaBrokers,
			Topic:    cfg.KafkaIngestTopic,
			Group:    cfg.KafkaGroup,
			ClientID: kafkaClient,
			Tracker:  edge,
			TTL:      cfg.TTL,
			Clock:    cfg.Clock,
			Logger:   cfg.Logger.With("component", "kafka-ingest"),
			// A dead node's partitions move within a third of the ttl
			// (at least the brokers' default minimum, 6s), before the
			// devices of its users expire.
			SessionTimeout: min(max(cfg.TTL/3, 6*time.Second), 10*time.Second),
		})
		if err != nil {
			return nil, err
		}
	}
	// The tracker reads the store, or what the node knows while Redis is down.
	qc := query.Config{States: a.tracker, Profiles: durable, Contacts: durable, Clock: cfg.Clock,
		ColdVersionMargin: reloadMargin}
	if a.replica != nil {
		qc.Statuses = a.replica
	}
	reader, err := query.New(qc)
	if err != nil {
		return nil, err
	}
	var webhookStats func() webhook.Stats
	if a.webhooks != nil {
		webhookStats = a.webhooks.Stats
	}
	var busStats func() natsbus.Stats
	if a.bus != nil {
		busStats = a.bus.Stats
	}
	var peerStats func() peers.Stats
	if a.peers != nil {
		peerStats = a.peers.Stats
	}
	var replicaStats func() replica.Stats
	if a.replica != nil {
		replicaStats = a.replica.Stats
	}
	var ingestStats func() ingest.Stats
	if a.ingest != nil {
		ingestStats = a.ingest.Stats
	}
	var kafkaInStats func() kafka.ConsumerStats
	if a.kafkaIn != nil {
		kafkaInStats = a.kafkaIn.Stats
	}
	var kafkaOutStats func() kafka.ProducerStats
	if a.kafkaOut != nil {
		kafkaOutStats = a.kafkaOut.Stats
	}
	a.reader = reader
	authn := auth.New(auth.Config{
		APIKey:      cfg.APIKey,
		JWTSecret:   cfg.JWTSecret,
		Dev:         cfg.Dev,
		Clock:       cfg.Clock,
		MaxLifetime: cfg.MaxTokenLifetime,
		Audience:    cfg.TokenAudience,
		Issuer:      cfg.TokenIssuer,
	})
	// One user's writes count once, whichever edge they come through.
	writes := ratelimit.NewWrites()
	a.gw, err = gateway.New(gateway.Config{
		Writes:           writes,
		Tracker:          edge,
		Reader:           reader,
		Auth:             authn,
		Clock:            cfg.Clock,
		Logger:           cfg.Logger.With("component", "ws"),
		TTL:              cfg.TTL,
		CloseGrace:       rules.CloseGrace,
		MaxSubscriptions: cfg.MaxSubscriptions,
		// The gateway's defaults where zero.
		MaxUserSubscriptions: cfg.MaxUserSubscriptions,
		MaxSocketsPerUser:    cfg.MaxSocketsPerUser,
		MaxSocketsPerDevice:  cfg.MaxSocketsPerDevice,
		Hub:                  a.hub,
		Workers:              gatewayWorkers(cfg),
		Origins:              origins,
	})
	if err != nil {
		return nil, err
	}
	a.metrics = metrics.New(metrics.Sources{
		Tracker:          a.tracker.Stats,
		SharedState:      cfg.RedisURL != "",
		Users:            users,
		Gateway:          a.gw.Stats,
		Hub:              a.hub.Stats,
		Bus:              busStats,
		Webhooks:         webhookStats,
		Ingest:           ingestStats,
		Peers:            peerStats,
		Replica:          replicaStats,
		KafkaIngest:      kafkaInStats,
		KafkaIngestTopic: cfg.KafkaIngestTopic,
		KafkaChanges:     kafkaOutStats,
		Connections: func() connbudget.Stats {
			if b := a.budget.Load(); b != nil {
				return b.Stats()
			}
			return connbudget.Stats{}
		},
	})
	a.api, err = httpapi.New(httpapi.Config{
		Tracker:           edge,
		Reader:            reader,
		Contacts:          durable,
		Profiles:          durable,
		Auth:              authn,
		Clock:             cfg.Clock,
		Logger:            cfg.Logger.With("component", "http"),
		Rules:             rules,
		Metrics:           a.metrics,
		MetricsHandler:    a.metrics.Handler(),
		Checks:            a.readiness(),
		PollInterval:      cfg.PollInterval,
		Static:            web.New(),
		Admin:             newAdminSource(a),
		OnContactsChanged: a.stampThen(onContacts),
		Origins:           origins,
		Writes:            writes,
	})
	if err != nil {
		return nil, err
	}
	a.handler = routes{api: a.api, ws: a.gw, hosts: &a.hosts}
	ok = true
	return a, nil
}

// nodeAlive is the tracker's NodeAlive from the beacon, nil without one.
func nodeAlive(b *beacon.Beacon) func(uint64) bool {
	if b == nil {
		return nil
	}
	return b.Alive
}

// trackerPeers is the tracker's Peers, nil without them.
func trackerPeers(p *peers.Peers) tracker.Peers {
	if p == nil {
		return nil
	}
	return p
}

// readiness lists what GET /readyz checks (httpapi.Check): whether this
// node can serve. The gateway and an embedded SQLite file are this node's
// own; PostgreSQL, Redis and NATS are shared by every node, so their
// outages are reported without failing readiness (docs/operations.md).
// a.gw is set before it is called.
// stampThen returns announce preceded by the tracker's stamp of a new
// version for the owner whose list changed (Tracker.ContactsChanged), so
// the views the hubs then send are above everything their watchers had.
func (a *App) stampThen(announce func(owner string)) func(owner string) {
	return func(owner string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := a.tracker.ContactsChanged(ctx, owner); err != nil {
			a.log.Warn("stamping a version for a changed contact list failed; watchers who lost sight may keep the last status they were sent",
				"user_id", owner, "err", err)
		}
		announce(owner)
	}
}

// userState reads one user's state now, for the hub's views of a user
// whose contact list changed.
func (a *App) userState(ctx context.Context, user string) (presence.Snapshot, error) {
	var s [1]presence.Snapshot
	err := a.tracker.Get(ctx, a.tracker.Now(), []string{user}, s[:])
	return s[0], err
}

func (a *App) readiness() []httpapi.Check {
	checks := []httpapi.Check{{Name: "gateway", Check: func(context.Context) error {
		if a.gw == nil || !a.gw.Serving() {
			return errors.New("the WebSocket gateway does not take connections (starting or stopping)")
		}
		return nil
	}}}
	if a.cfg.PostgresURL != "" {
		checks = append(checks, httpapi.Check{Name: "postgres", Shared: true, Check: a.durable.Ping})
	} else {
		checks = append(checks, httpapi.Check{Name: "sqlite", Check: a.durable.Ping})
	}
	if a.redis != nil {
		checks = append(checks, httpapi.Check{Name: "redis", Shared: true, Check: func(context.Context) error {
			if a.tracker.StoreDown() {
				return errors.New("the state store is down: writes are buffered in the node")
			}
			return nil
		}})
	}
	if a.bus != nil {
		checks = append(checks, httpapi.Check{Name: "nats", Shared: true, Check: a.natsReady})
	}
	switch {
	case a.kafkaOut != nil:
		checks = append(checks, httpapi.Check{Name: "kafka", Shared: true, Check: a.kafkaOut.Ping})
	case a.kafkaIn != nil:
		checks = append(checks, httpapi.Check{Name: "kafka", Shared: true, Check: a.kafkaIn.Ping})
	}
	return checks
}

// natsReady is the readiness check of NATS: it answers, and the changes
// stream takes this node's changes (states stream_missing and
// stream_behind otherwise: docs/operations.md, "Readiness").
func (a *App) natsReady(ctx context.Context) error {
	if err := a.bus.Ping(ctx); err != nil {
		return err
	}
	switch h := a.bus.Stream(); {
	case h.Missing:
		return &httpapi.StateError{State: "stream_missing", Err: fmt.Errorf(
			"the changes stream is missing and cannot be created again; %d changes of this node wait", h.Waiting)}
	case h.Unacked > 0:
		return &httpapi.StateError{State: "stream_behind", Err: fmt.Errorf(
			"the changes stream has acknowledged none of this node's changes for %v; %d wait", h.Unacked.Round(time.Millisecond), h.Waiting)}
	}
	return nil
}

// gatewayWorkers is how many goroutines read WebSockets. With the state in
// memory a heartbeat waits for nothing, and 16 keep two cores busy. With
// Redis each one waits for its script's round trip: only as many
// heartbeats are in flight — and pipelined together by the client — as
// there are workers, so a few hundred keep Redis, not the round trip, the
// limit (measured: 16 workers held one node to 6.7k beats/s). With
// webhooks, either way, a heartbeat that changes the user's status also
// waits until the change is in their log (confirm.go: the outbox's fsync,
// shared by the changes queued with it, or the stream's ack), at most
// webhook.Config.ConfirmTimeout and not at all while that log is known
// failing; one that changes nothing waits for nothing more.
func gatewayWorkers(cfg Config) int {
	if cfg.RedisURL != "" {
		return 512
	}
	return 16
}

// openDurable opens PostgreSQL when configured, else the embedded SQLite
// file.
func openDurable(ctx context.Context, cfg Config) (durableStore, error) {
	if cfg.PostgresURL != "" {
		return pgstore.Open(ctx, pgstore.Config{URL: cfg.PostgresURL, Logger: cfg.Logger.With("component", "postgres")})
	}
	return sqlitestore.Open(ctx, sqlitestore.Config{
		Path:   filepath.Join(cfg.DataDir, "presenced.db"),
		Logger: cfg.Logger.With("component", "sqlite"),
	})
}

// closeBackends closes what New opened, in reverse order.
func (a *App) closeBackends() error {
	var err error
	if a.kafkaIn != nil {
		err = errors.Join(err, a.kafkaIn.Close())
	}
	if a.ingest != nil {
		err = errors.Join(err, a.ingest.Close())
	}
	if a.kafkaOut != nil {
		a.kafkaOut.Close()
	}
	if a.bus != nil {
		err = errors.Join(err, a.bus.Close())
	}
	if a.nats != nil {
		a.nats.Close()
	}
	if a.redis != nil {
		a.redis.Close()
	}
	if a.durable != nil {
		err = errors.Join(err, a.durable.Close())
	}
	return err
}

// wsPath is the WebSocket gateway's path: GET upgrades, every other
// method is refused by the gateway (405).
const wsPath = "/v1/ws"

// routes refuses a Host the node does not answer to (DNS rebinding:
// origin.Hosts) but on the health checks, which probes may send any Host,
// then sends GET /v1/ws to the WebSocket gateway and everything else to
// the HTTP API.
type routes struct {
	api, ws http.Handler
	hosts   *atomic.Pointer[origin.Hosts]
}

// hostsFor returns the Host names the node answers to when it listens on
// addr: a node under -dev or on a loopback address is local.
func (a *App) hostsFor(addr string) (*origin.Hosts, error) {
	listen := []string{addr}
	if a.cfg.HealthAddr != "" {
		listen = append(listen, a.cfg.HealthAddr)
	}
	return origin.NewHosts(origin.HostConfig{Allowed: a.cfg.AllowedHosts, Local: a.cfg.Dev || origin.Loopback(addr), Listen: listen})
}

// checkHost returns the refusal of r's Host, or nil; the health checks
// take every Host (a probe may send the pod's address or any name).
func checkHost(hosts *origin.Hosts, r *http.Request) *apierr.Error {
	if p := r.URL.Path; p == "/healthz" || p == "/readyz" {
		return nil
	}
	return hosts.Check(r)
}

// Patterns returns the net/http patterns of every route the node's
// Handler serves: the HTTP API's (httpapi.Server.Patterns) and the
// WebSocket upgrade. The API description is checked against them.
func (a *App) Patterns() []string { return append(a.api.Patterns(), "GET "+wsPath) }

// BrowserPatterns returns the patterns of the endpoints a browser page
// calls with a client token (httpapi.Server.BrowserPatterns): CORS for
// allowed origins, and a preflight (OPTIONS) on each of their paths.
func (a *App) BrowserPatterns() []string { return a.api.BrowserPatterns() }

func (h routes) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if e := checkHost(h.hosts.Load(), r); e != nil {
		apierr.Write(w, e)
		return
	}
	if r.URL.Path == wsPath {
		h.ws.ServeHTTP(w, r)
		return
	}
	h.api.ServeHTTP(w, r)
}

// acceptUpgrade is the gateway's Accept for upgrades read off the
// listener (wsaccept), behind the Host check that routes applies to
// everything net/http serves.
func (a *App) acceptUpgrade(conn net.Conn, br *bufio.Reader, r *http.Request) bool {
	if e := checkHost(a.hosts.Load(), r); e != nil {
		_ = conn.SetWriteDeadline(time.Now().Add(a.cfg.HeaderTimeout))
		gateway.RefuseHead(conn, e.Status, e.Code, e.Message)
		_ = conn.Close()
		return false
	}
	return a.gw.Accept(conn, br, r)
}

// publishers hands every change to each of its publishers in turn.
type publishers []tracker.Publisher

func (ps publishers) Publish(ev *presence.Event) {
	for _, p := range ps {
		p.Publish(ev)
	}
}

// logPublisher logs every change of visible presence at debug level
// (-log-level debug).
type logPublisher struct{ log *slog.Logger }

func (p logPublisher) Publish(ev *presence.Event) {
	if p.log.Enabled(context.Background(), slog.LevelDebug) {
		p.log.Debug("presence change", "user_id", ev.UserID, "from", ev.Prev.String(), "to", ev.Status.String(),
			"text", ev.Text, "version", ev.Version)
	}
}

// Handler is the node's HTTP API and WebSocket endpoint. WebSockets are
// accepted only while Run runs.
func (a *App) Handler() http.Handler { return a.handler }

// ReloadTLS loads the certificate and key files again (on SIGHUP): new
// handshakes present the new pair; a pair that does not load leaves the
// one in use, and the error says why. Without TLS it is an error.
func (a *App) ReloadTLS() error {
	if a.cert == nil {
		return errors.New("no TLS certificate to reload: the node serves plain HTTP")
	}
	return a.cert.Reload()
}

// TLS reports whether the clients' listener serves HTTPS and WSS.
func (a *App) TLS() bool { return a.cert != nil }

// AcceptStats counts the first requests the clients' listener took as
// WebSocket upgrades without net/http, and the connections it passed on.
func (a *App) AcceptStats() wsaccept.Stats {
	if l := a.accept.Load(); l != nil {
		return l.Stats()
	}
	return wsaccept.Stats{}
}

// Gateway is the node's WebSocket gateway (tests read its counters).
func (a *App) Gateway() *gateway.Gateway { return a.gw }

// Tracker is the node's tracker (tests drive sweeps and checkpoints).
func (a *App) Tracker() *tracker.Tracker { return a.tracker }

// Run serves on ln (or on cfg.Addr when ln is nil) until ctx is done, then
// shuts down gracefully: stop taking requests, finish the ones in flight,
// close every WebSocket with 1001, stop the tracker, write the last
// checkpoint, close the durable store.
func (a *App) Run(ctx context.Context, ln net.Listener) error {
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", a.cfg.Addr); err != nil {
			a.Close()
			return fmt.Errorf("listen: %w", err)
		}
	}
	a.log.Info("presenced listening", "addr", ln.Addr().String(), "tls", a.cert != nil, "mode", a.cfg.Mode(), "data", a.cfg.DataDir,
		"ttl", a.cfg.TTL, "idle_after", a.cfg.IdleAfter, "close_grace", a.rules.CloseGrace)
	hosts, herr := a.hostsFor(ln.Addr().String())
	if herr != nil { // checked by New already
		ln.Close()
		a.Close()
		return fmt.Errorf("allowed hosts: %w", herr)
	}
	a.hosts.Store(hosts)
	a.log.Info("answering Host names", "hosts", hosts.String())
	if a.cert != nil {
		leaf := a.cert.Certificate().Leaf
		a.log.Info("serving HTTPS and WSS", "subject", leaf.Subject.String(), "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter)
	}

	// The budget counts TCP connections, before any TLS handshake, and
	// bounds the time from the accept to the end of the first request's
	// head (handshake included) by HeaderTimeout; the TLS listener goes
	// around it.
	var tlsConf *tls.Config
	if a.cert != nil {
		tlsConf = a.cert.Config()
	}
	budget := connbudget.New(ln, connbudget.Config{Max: a.cfg.MaxConns, PerAddr: a.cfg.MaxConnsPerAddr,
		Pending: a.cfg.MaxPendingConns, HeaderTimeout: a.cfg.HeaderTimeout, MaxHeaderBytes: a.cfg.MaxHeaderBytes,
		Logger: a.log, TLS: tlsConf})
	var clients net.Listener = budget
	if tlsConf != nil {
		clients = tls.NewListener(budget, tlsConf)
	}
	// WebSocket upgrades are read off the listener before net/http sees
	// the connection (wsaccept: no net/http reader, writer or response
	// left behind per socket); everything else goes on to net/http.
	accept := wsaccept.New(clients, wsaccept.Config{
		Path:           wsPath,
		HeaderTimeout:  a.cfg.HeaderTimeout,
		MaxHeaderBytes: a.cfg.MaxHeaderBytes,
		Upgrade:        a.acceptUpgrade,
		State:          budget.ConnState,
		Refuse:         gateway.RefuseHead,
		Logger:         a.log,
	})
	a.accept.Store(accept)
	clients = accept
	a.log.Info("connection budget", "max", a.cfg.MaxConns, "per_address", a.cfg.MaxConnsPerAddr,
		"pending", a.cfg.MaxPendingConns, "file_limit", connbudget.FileLimit())
	a.budget.Store(budget)
	srv := a.httpServer(a.handler, budget)
	var healthSrv *http.Server
	if a.cfg.HealthAddr != "" {
		hln, err := net.Listen("tcp", a.cfg.HealthAddr)
		if err != nil {
			ln.Close()
			a.Close()
			return fmt.Errorf("listen for health checks: %w", err)
		}
		// Its own small budget: probes are few.
		hb := connbudget.New(hln, connbudget.Config{Max: 128, Pending: 32, HeaderTimeout: a.cfg.HeaderTimeout,
			MaxHeaderBytes: a.cfg.MaxHeaderBytes, Logger: a.log})
		healthSrv = a.httpServer(healthOnly(a.handler), hb)
		a.log.Info("health checks listening", "addr", hln.Addr().String())
		go func() {
			if err := healthSrv.Serve(hb); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.log.Warn("health listener stopped", "err", err)
			}
		}()
		defer healthSrv.Close() // probes are answered (/readyz: draining) until the end
	}
	trackerCtx, stopTracker := context.WithCancel(context.WithoutCancel(ctx))
	defer stopTracker()
	gwCtx, stopGateway := context.WithCancel(context.WithoutCancel(ctx))
	defer stopGateway()
	var wg sync.WaitGroup
	hubCtx, stopHub := context.WithCancel(context.WithoutCancel(ctx))
	defer stopHub()
	// The bus outlives the tracker (its last events go out); the ingest
	// consumer stops before it (it drives the tracker).
	busCtx, stopBus := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBus()
	busDone := make(chan error, 1)
	if a.bus != nil {
		wg.Go(func() { busDone <- a.bus.Run(busCtx) })
	} else {
		busDone <- nil
	}
	if a.beacon != nil {
		wg.Go(func() { _ = a.beacon.Run(busCtx, a.tracker.LeaseID) })
	}
	if a.webhooks != nil {
		// Like the bus, it outlives the tracker: its last changes go out.
		wg.Go(func() { _ = a.webhooks.Run(busCtx) })
	}
	if a.kafkaOut != nil {
		wg.Go(func() { _ = a.kafkaOut.Run(busCtx) }) // likewise
	}
	if a.replica != nil {
		wg.Go(func() { _ = a.replica.Run(busCtx) })
	}
	if a.peers != nil {
		wg.Go(func() {
			if err := a.peers.Serve(busCtx, a.tracker); err != nil {
				a.log.Warn("answering other nodes' questions stopped", "err", err)
			}
		})
	}
	resyncCtx, stopResync := context.WithCancel(context.WithoutCancel(ctx))
	defer stopResync()
	wg.Go(func() { a.resync.Run(resyncCtx, a.hub, a.reader.Read, func() bool { return a.tracker.Stats().Down }) })
	ingestCtx, stopIngest := context.WithCancel(context.WithoutCancel(ctx))
	defer stopIngest()
	ingestDone := make(chan error, 1)
	if a.ingest != nil {
		wg.Go(func() { ingestDone <- a.ingest.Run(ingestCtx) })
	} else {
		ingestDone <- nil
	}
	kafkaInDone := make(chan error, 1)
	if a.kafkaIn != nil {
		// Like the JetStream ingest it stops before the tracker, leaving
		// the group: its partitions move to the other nodes at once.
		wg.Go(func() { kafkaInDone <- a.kafkaIn.Run(ingestCtx) })
	} else {
		kafkaInDone <- nil
	}
	wg.Add(4)
	go func() {
		defer wg.Done()
		_ = a.hub.Run(hubCtx)
	}()
	gwDone := make(chan error, 1)
	go func() {
		defer wg.Done()
		gwDone <- a.gw.Run(gwCtx)
	}()
	trackerDone := make(chan error, 1)
	go func() {
		defer wg.Done()
		trackerDone <- a.tracker.Run(trackerCtx)
	}()
	// Take requests only once the gateway takes sockets.
	select {
	case <-a.gw.Ready():
	case <-ctx.Done():
	}
	serveErr := make(chan error, 1)
	go func() {
		defer wg.Done()
		serveErr <- srv.Serve(clients)
	}()

	var err error
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		serveErr <- err
	}
	a.log.Info("presenced shutting down")
	a.api.Drain()

	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ShutdownTimeout)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		a.log.Warn("http shutdown", "err", serr)
		srv.Close()
	}
	if serr := <-serveErr; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	// Hijacked WebSockets are not the HTTP server's: close them (1001)
	// before the tracker stops.
	stopGateway()
	if gerr := <-gwDone; gerr != nil {
		err = errors.Join(err, gerr)
	}
	stopIngest()
	if ierr := <-ingestDone; ierr != nil {
		err = errors.Join(err, ierr)
	}
	if kerr := <-kafkaInDone; kerr != nil {
		err = errors.Join(err, kerr)
	}
	stopTracker()
	if terr := <-trackerDone; terr != nil {
		a.log.Error("final checkpoint failed", "err", terr)
		err = errors.Join(err, terr)
	}
	stopBus()
	if berr := <-busDone; berr != nil {
		err = errors.Join(err, berr)
	}
	stopResync()
	stopHub()
	wg.Wait()
	if cerr := a.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	a.log.Info("presenced stopped")
	return err
}

// httpServer serves h on a budgeted listener: short deadlines for a
// request's headers, a small cap on their size, and the budget's watch
// over request bodies (connbudget.Listener.Handler).
func (a *App) httpServer(h http.Handler, b *connbudget.Listener) *http.Server {
	return &http.Server{
		Handler:           b.Handler(h),
		ConnState:         b.ConnState,
		ConnContext:       b.ConnContext,
		ReadHeaderTimeout: a.cfg.HeaderTimeout,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    a.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
}

// healthOnly serves the health, readiness and metrics endpoints of h and a
// JSON 404 for anything else.
func healthOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz", "/readyz", "/metrics":
			h.ServeHTTP(w, r)
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":{"code":"not_found","message":"this listener serves /healthz, /readyz and /metrics only"}}`))
		}
	})
}

// Close writes the last checkpoint and closes the durable store. It is
// idempotent; Run calls it.
func (a *App) Close() error {
	a.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
		defer cancel()
		a.closeErr = errors.Join(a.tracker.Close(ctx), a.closeBackends())
	})
	return a.closeErr
}

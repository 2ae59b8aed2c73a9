package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/presence"
)

// options are the command's flags: the node's Config, bound to its
// flags, and what the command itself decides (credentials, logs, the
// actions).
type options struct {
	cfg                              app.Config
	apiKey, jwtSecret, webhookSecret string
	logLevel, logFormat              string
	showVersion                      bool
	healthURL, printToken            string
	printTokenRooms                  []string
	pprofAddr                        string
	// set reports whether a flag was given, on the command line or by
	// its environment variable.
	set func(name string) bool
}

// envPrefix is the prefix of every flag's environment variable:
// -heartbeat-ttl is PRESENCE_HEARTBEAT_TTL.
const envPrefix = "PRESENCE_"

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// actions are the flags that are no setting but something to do, and
// have no environment variable.
var actions = map[string]bool{"print-token": true, "print-token-rooms": true, "version": true, "healthcheck": true}

// parse reads args, then the environment (getenv) for the flags args do
// not give. -h prints the usage to stderr and returns flag.ErrHelp.
func parse(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("presenced", flag.ContinueOnError)
	fs.SetOutput(stderr)
	d := app.Defaults()
	o.nodeFlags(fs, d)
	o.edgeFlags(fs, d)
	o.commandFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: presenced [flags]\n\nEvery flag can also be set by its environment variable, e.g. -heartbeat-ttl by %s.\n\n", envName("heartbeat-ttl"))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if v := getenv(envName(f.Name)); v != "" && !given[f.Name] && !actions[f.Name] && err == nil {
			if serr := f.Value.Set(v); serr != nil {
				err = fmt.Errorf("%s=%q: %v", envName(f.Name), v, serr)
			}
		}
	})
	o.set = func(name string) bool { return given[name] || getenv(envName(name)) != "" }
	return o, err
}

// nodeFlags declares the flags of the state model, its limits and its
// backends, bound to o.cfg with d's defaults.
func (o *options) nodeFlags(fs *flag.FlagSet, d app.Config) {
	c := &o.cfg
	fs.StringVar(&c.DataDir, "data", d.DataDir, "directory of the embedded state (SQLite file, generated keys)")
	fs.DurationVar(&c.TTL, "heartbeat-ttl", d.TTL, "a device is online until this long after its last heartbeat")
	fs.DurationVar(&c.IdleAfter, "idle-after", d.IdleAfter, "online turns away after this long without activity")
	c.CloseGrace = d.CloseGrace
	fs.Var((*graceFlag)(&c.CloseGrace), "close-grace", "a device whose WebSocket closed without a bye goes offline this long after, unless it reconnects; 0: at once (no grace); cut to -heartbeat-ttl (the device then lives its whole ttl)")
	fs.IntVar(&c.MaxDevices, "max-devices", d.MaxDevices, "alive devices per user; a heartbeat of one more is refused")
	fs.IntVar(&c.MaxRooms, "max-rooms", d.MaxRooms, "rooms one device may be in at once; a join of one more is refused")
	fs.IntVar(&c.MaxSubscriptions, "max-subscriptions", d.MaxSubscriptions, "users one WebSocket connection may watch")
	fs.IntVar(&c.MaxWatchedRooms, "max-watched-rooms", d.MaxWatchedRooms, "rooms one WebSocket connection may watch")
	fs.IntVar(&c.RoomIntervalAbove, "room-interval-above", d.RoomIntervalAbove, "rooms with more members than this send their watchers one message per -room-interval instead of one per change (back below nine tenths of it)")
	fs.DurationVar(&c.RoomInterval, "room-interval", d.RoomInterval, "how often the watchers of a big room (-room-interval-above) are sent its joins and leaves")
	fs.IntVar(&c.MaxUserSubscriptions, "max-user-subscriptions", d.MaxUserSubscriptions, "users one user may watch across all their WebSockets to this node (default 10 × -max-subscriptions)")
	fs.IntVar(&c.MaxSocketsPerUser, "max-sockets-per-user", d.MaxSocketsPerUser, "WebSockets one user may hold open to this node")
	fs.IntVar(&c.MaxSocketsPerDevice, "max-sockets-per-device", d.MaxSocketsPerDevice, "WebSockets one device (e.g. the tabs of one browser) may hold open to this node")
	fs.IntVar(&c.FanoutAsyncThreshold, "fanout-async-threshold", d.FanoutAsyncThreshold, "users with more watchers than this are delivered by the batched, coalescing fan-out path")
	fs.DurationVar(&c.PollInterval, "poll-interval", d.PollInterval, "clients reading presence over HTTP with their own token may read once per interval (0 disables)")
	fs.DurationVar(&c.MaxTokenLifetime, "max-token-lifetime", d.MaxTokenLifetime, "client tokens whose exp is more than this after now, or after their iat, are refused")
	fs.StringVar(&c.TokenAudience, "token-audience", d.TokenAudience, "client tokens must carry this value in aud (empty: aud is not checked)")
	fs.StringVar(&c.TokenIssuer, "token-issuer", d.TokenIssuer, "client tokens must carry this iss (empty: iss is not checked)")
	fs.BoolVar(&c.Dev, "dev", d.Dev, "INSECURE development mode: accept requests without credentials")
	fs.StringVar(&c.RedisURL, "redis-url", d.RedisURL, "scale-out: hot state in this Redis (redis://host:6379/0; a Cluster: redis://a:6379?addr=b:6379); needs -postgres-url")
	fs.StringVar(&c.RedisPrefix, "redis-prefix", d.RedisPrefix, "scale-out: prefix of every Redis key (deployments sharing a Redis differ by it)")
	fs.IntVar(&c.RedisBuckets, "redis-buckets", d.RedisBuckets, "scale-out: hashes each of Redis's 256 shards packs its users in at first (a shard adds one per 48 users past 48 a hash); 0: the number Redis recorded, else 64 (the same on every node)")
	fs.StringVar(&c.PostgresURL, "postgres-url", d.PostgresURL, "scale-out: durable store in this PostgreSQL database (postgres://user@host:5432/db) instead of SQLite")
	fs.StringVar(&c.NATSURL, "nats-url", d.NATSURL, "scale-out: NATS JetStream for changes across nodes, the presence.changes stream and the ingest consumer (nats://host:4222)")
	fs.StringVar(&c.NodeID, "node-id", d.NodeID, "this node's name on the NATS bus (default: host name and a random suffix)")
	fs.BoolVar(&c.NoIngest, "no-ingest", d.NoIngest, "with -nats-url: do not run the consumer of session events on presence.ingest.>")
	fs.BoolVar(&c.ReadReplica, "read-replica", d.ReadReplica, "with -redis-url and -nats-url: keep every user's public status in this node, fed by every change on the bus, and answer GET /presence/batch from it (memory: ~155 B a user held)")
	fs.IntVar(&c.ReadReplicaUsers, "read-replica-users", d.ReadReplicaUsers, "with -redis-url and -nats-url and without -read-replica: the users whose public status this node keeps at most (those read and changed lately, read from Redis on a miss) to answer GET /presence/batch; -1: none")
	fs.Var((*listFlag)(&c.WebhookURLs), "webhook-url", "POST every change of presence to this URL, at least once (repeat the flag, or separate URLs with commas; needs -nats-url with -postgres-url)")
	fs.Var((*listFlag)(&c.KafkaBrokers), "kafka-brokers", "Kafka brokers, host:port (repeat the flag, or separate them with commas): consume session events from -kafka-ingest-topic, produce every change this node makes to -kafka-changes-topic")
	fs.StringVar(&c.KafkaIngestTopic, "kafka-ingest-topic", d.KafkaIngestTopic, "with -kafka-brokers: the topic of session events (as on presence.ingest.>, keyed by user id) the nodes consume in the group -kafka-group; empty (-kafka-ingest-topic=): no consumer")
	fs.StringVar(&c.KafkaGroup, "kafka-group", d.KafkaGroup, "with -kafka-brokers: the consumer group every node joins")
	fs.StringVar(&c.KafkaChangesTopic, "kafka-changes-topic", d.KafkaChangesTopic, "with -kafka-brokers: the topic every change this node makes is produced to, keyed by user id; empty (-kafka-changes-topic=): no producer")
}

// edgeFlags declares the flags of the listeners, connections and the
// browser pages and Host names the node takes, bound to o.cfg with d's
// defaults.
func (o *options) edgeFlags(fs *flag.FlagSet, d app.Config) {
	c := &o.cfg
	fs.StringVar(&c.Addr, "addr", d.Addr, "listen address (with -dev and no -addr: "+devAddr+")")
	fs.IntVar(&c.MaxConns, "max-conns", d.MaxConns, "open client connections (HTTP and WebSocket); by default the file limit less a reserve; 0: no cap")
	fs.IntVar(&c.MaxConnsPerAddr, "max-conns-per-ip", d.MaxConnsPerAddr, "open connections of one source address (IPv6: one /64); by default a quarter of -max-conns (with -dev: no cap); 0: no cap (behind a proxy, all clients share its address)")
	fs.IntVar(&c.MaxPendingConns, "max-pending-conns", d.MaxPendingConns, "connections the node waits on to send a request (head, body, TLS handshake): beyond it, the one stalled longest makes room for a new one; by default an eighth of -max-conns, at most 1024; 0: no cap")
	fs.DurationVar(&c.HeaderTimeout, "header-timeout", d.HeaderTimeout, "a request's line and headers must arrive within this")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", d.MaxHeaderBytes, "request line and headers, in bytes; beyond it 431")
	fs.StringVar(&c.HealthAddr, "health-addr", d.HealthAddr, "also serve /healthz, /readyz and /metrics on this address, outside the clients' connection caps (e.g. :8081 for a load balancer's probes)")
	fs.StringVar(&c.TLSCertFile, "tls-cert", d.TLSCertFile, "serve HTTPS and WSS on -addr with this certificate file (PEM, the chain after the leaf), reloaded on SIGHUP; needs -tls-key (-health-addr stays plain HTTP)")
	fs.StringVar(&c.TLSKeyFile, "tls-key", d.TLSKeyFile, "the private key file (PEM) of -tls-cert")
	fs.Var((*listFlag)(&c.AllowedOrigins), "allowed-origins", "origins of the browser pages, besides the node's own, that may open WebSockets and call the client endpoints (CORS): https://app.example.com, https://*.example.com (any subdomain), or * (any page); repeat the flag or separate them with commas (default: the node's own pages only)")
	fs.Var((*listFlag)(&c.AllowedHosts), "allowed-hosts", "Host names the node answers to besides IP addresses and localhost (a defence against DNS rebinding): presence.example.com, *.example.com (any subdomain), or * (any); repeat the flag or separate them with commas (default: any name, but under -dev or on a loopback -addr only the -addr host); /healthz and /readyz answer any Host")
}

// commandFlags declares the flags the command decides itself: the
// credentials, the logs, profiling and the actions.
func (o *options) commandFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.apiKey, "api-key", "", "API key of app backends (default: generated once into <data>/api-key)")
	fs.StringVar(&o.jwtSecret, "jwt-secret", "", "HS256 secret of client tokens (default: generated once into <data>/jwt-secret)")
	fs.StringVar(&o.webhookSecret, "webhook-secret", "", "HMAC-SHA256 key that signs webhook requests (required with -webhook-url; 32 bytes or more)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "text (logfmt) or json (one object a line)")
	fs.StringVar(&o.pprofAddr, "pprof-addr", "", "serve Go's profiling endpoints (/debug/pprof/) on this loopback address, e.g. 127.0.0.1:6060 (off by default)")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	fs.StringVar(&o.healthURL, "healthcheck", "", "GET this URL (e.g. http://127.0.0.1:8081/healthz) and exit 0 if it answers 200, 1 if not: a container's HEALTHCHECK, as the image has no curl")
	fs.StringVar(&o.printToken, "print-token", "", "print a client token for this user id (signed with the JWT secret, valid for -max-token-lifetime, with -token-audience and -token-issuer) and exit")
	fs.Var((*listFlag)(&o.printTokenRooms), "print-token-rooms", "with -print-token: the rooms the token lets its user enter, each a room id, a prefix ending in * (team-7-*), or * alone (every room); repeat the flag or separate them with commas")
}

// graceFlag is -close-grace: a duration, 0 turning the grace off
// (presence.NoCloseGrace, since a zero app.Config.CloseGrace means the
// default), a negative one refused.
type graceFlag time.Duration

func (g *graceFlag) String() string {
	if time.Duration(*g) < 0 {
		return "0s"
	}
	return time.Duration(*g).String()
}

func (g *graceFlag) Set(v string) error {
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return errors.New("parse error")
	case d < 0:
		return fmt.Errorf("%s is negative (0 turns the grace off)", d)
	case d == 0:
		d = presence.NoCloseGrace
	}
	*g = graceFlag(d)
	return nil
}

// listFlag is a flag of a list (URLs, addresses): repeated, or separated
// by commas.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, u := range strings.Split(v, ",") {
		if u = strings.TrimSpace(u); u != "" {
			*l = append(*l, u)
		}
	}
	return nil
}

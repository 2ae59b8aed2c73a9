// Command presenced is the presence service: `go run ./cmd/presenced`
// starts the embedded single-node default on :8080 with its state under
// ./data and nothing else installed.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	neturl "net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/buildinfo"
	"github.com/presenced/presenced/internal/connbudget"
	"github.com/presenced/presenced/internal/kafka"
	"github.com/presenced/presenced/internal/origin"
	"github.com/presenced/presenced/internal/presence"
	"github.com/presenced/presenced/internal/tlscert"
	"github.com/presenced/presenced/internal/tracing"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// After the first signal starts a graceful shutdown, a second one
		// kills the process the usual way.
		<-ctx.Done()
		stop()
	}()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "presenced:", err)
		os.Exit(1)
	}
}

// envPrefix is the prefix of every flag's environment variable:
// -heartbeat-ttl is PRESENCE_HEARTBEAT_TTL.
const envPrefix = "PRESENCE_"

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fset := flag.NewFlagSet("presenced", flag.ContinueOnError)
	fset.SetOutput(stderr)
	budget := connbudget.Defaults(connbudget.FileLimit())
	var (
		addr          = fset.String("addr", ":8080", "listen address (with -dev and no -addr: 127.0.0.1:8080)")
		dataDir       = fset.String("data", "./data", "directory of the embedded state (SQLite file, generated keys)")
		ttl           = fset.Duration("heartbeat-ttl", presence.DefaultTTL, "a device is online until this long after its last heartbeat")
		idleAfter     = fset.Duration("idle-after", presence.DefaultIdleAfter, "online turns away after this long without activity")
		closeGrace    = fset.Duration("close-grace", 5*time.Second, "a device whose WebSocket closed without a bye goes offline this long after, unless it reconnects (cut to -heartbeat-ttl, which turns it off)")
		maxDevices    = fset.Int("max-devices", 32, "alive devices per user; a heartbeat of one more is refused")
		maxSubs       = fset.Int("max-subscriptions", presence.DefaultMaxSubscriptions, "users one WebSocket connection may watch")
		maxUserSubs   = fset.Int("max-user-subscriptions", 0, "users one user may watch across all their WebSockets to this node (default 10 × -max-subscriptions)")
		maxUserSocks  = fset.Int("max-sockets-per-user", 64, "WebSockets one user may hold open to this node")
		maxDevSocks   = fset.Int("max-sockets-per-device", 8, "WebSockets one device (e.g. the tabs of one browser) may hold open to this node")
		asyncFanout   = fset.Int("fanout-async-threshold", 10000, "users with more watchers than this are delivered by the batched, coalescing fan-out path")
		pollInterval  = fset.Duration("poll-interval", 30*time.Second, "clients reading presence over HTTP with their own token may read once per interval (0 disables)")
		apiKey        = fset.String("api-key", "", "API key of app backends (default: generated once into <data>/api-key)")
		jwtSecret     = fset.String("jwt-secret", "", "HS256 secret of client tokens (default: generated once into <data>/jwt-secret)")
		maxTokenLife  = fset.Duration("max-token-lifetime", auth.DefaultMaxLifetime, "client tokens whose exp is more than this after now, or after their iat, are refused")
		tokenAud      = fset.String("token-audience", "", "client tokens must carry this value in aud (empty: aud is not checked)")
		tokenIss      = fset.String("token-issuer", "", "client tokens must carry this iss (empty: iss is not checked)")
		dev           = fset.Bool("dev", false, "INSECURE development mode: accept requests without credentials")
		logLevel      = fset.String("log-level", "info", "debug, info, warn or error")
		logFormat     = fset.String("log-format", "text", "text (logfmt) or json (one object a line)")
		showVersion   = fset.Bool("version", false, "print the version and exit")
		healthURL     = fset.String("healthcheck", "", "GET this URL (e.g. http://127.0.0.1:8081/healthz) and exit 0 if it answers 200, 1 if not: a container's HEALTHCHECK, as the image has no curl")
		printToken    = fset.String("print-token", "", "print a client token for this user id (signed with the JWT secret, valid for -max-token-lifetime, with -token-audience and -token-issuer) and exit")
		redisURL      = fset.String("redis-url", "", "scale-out: hot state in this Redis (redis://host:6379/0; a Cluster: redis://a:6379?addr=b:6379); needs -postgres-url")
		redisPrefix   = fset.String("redis-prefix", "presenced:", "scale-out: prefix of every Redis key (deployments sharing a Redis differ by it)")
		redisBuckets  = fset.Int("redis-buckets", 64, "scale-out: hashes each of Redis's 256 shards packs its users in; users held / 16384 for ~64 a hash (the same on every node)")
		postgresURL   = fset.String("postgres-url", "", "scale-out: durable store in this PostgreSQL database (postgres://user@host:5432/db) instead of SQLite")
		natsURL       = fset.String("nats-url", "", "scale-out: NATS JetStream for changes across nodes, the presence.changes stream and the ingest consumer (nats://host:4222)")
		nodeID        = fset.String("node-id", "", "this node's name on the NATS bus (default: host name and a random suffix)")
		noIngest      = fset.Bool("no-ingest", false, "with -nats-url: do not run the consumer of session events on presence.ingest.>")
		readReplica   = fset.Bool("read-replica", false, "with -redis-url and -nats-url: keep every user's public status in this node, fed by every change on the bus, and answer GET /presence/batch from it (memory: ~100 B a user held)")
		maxConns      = fset.Int("max-conns", budget.Max, "open client connections (HTTP and WebSocket); by default the file limit less a reserve; 0: no cap")
		maxConnsIP    = fset.Int("max-conns-per-ip", 0, "open connections of one source address (IPv6: one /64); by default a quarter of -max-conns (with -dev: no cap); 0: no cap (behind a proxy, all clients share its address)")
		maxPending    = fset.Int("max-pending-conns", 0, "connections the node waits on to send a request (head, body, TLS handshake): beyond it, the one stalled longest makes room for a new one; by default an eighth of -max-conns, at most 1024; 0: no cap")
		headerTO      = fset.Duration("header-timeout", 5*time.Second, "a request's line and headers must arrive within this")
		maxHeader     = fset.Int("max-header-bytes", app.DefaultMaxHeaderBytes, "request line and headers, in bytes; beyond it 431")
		healthAddr    = fset.String("health-addr", "", "also serve /healthz, /readyz and /metrics on this address, outside the clients' connection caps (e.g. :8081 for a load balancer's probes)")
		webhookSecret = fset.String("webhook-secret", "", "HMAC-SHA256 key that signs webhook requests (required with -webhook-url; 32 bytes or more)")
		tlsCert       = fset.String("tls-cert", "", "serve HTTPS and WSS on -addr with this certificate file (PEM, the chain after the leaf), reloaded on SIGHUP; needs -tls-key (-health-addr stays plain HTTP)")
		tlsKey        = fset.String("tls-key", "", "the private key file (PEM) of -tls-cert")
		pprofAddr     = fset.String("pprof-addr", "", "serve Go's profiling endpoints (/debug/pprof/) on this loopback address, e.g. 127.0.0.1:6060 (off by default)")
	)
	var webhookURLs, kafkaBrokers, allowedOrigins, allowedHosts listFlag
	fset.Var(&allowedOrigins, "allowed-origins", "origins of the browser pages, besides the node's own, that may open WebSockets and call the client endpoints (CORS): https://app.example.com, https://*.example.com (any subdomain), or * (any page); repeat the flag or separate them with commas (default: the node's own pages only)")
	fset.Var(&allowedHosts, "allowed-hosts", "Host names the node answers to besides IP addresses and localhost (a defence against DNS rebinding): presence.example.com, *.example.com (any subdomain), or * (any); repeat the flag or separate them with commas (default: any name, but under -dev or on a loopback -addr only the -addr host); /healthz and /readyz answer any Host")
	fset.Var(&webhookURLs, "webhook-url", "POST every change of presence to this URL, at least once (repeat the flag, or separate URLs with commas; needs -nats-url with -postgres-url)")
	fset.Var(&kafkaBrokers, "kafka-brokers", "Kafka brokers, host:port (repeat the flag, or separate them with commas): consume session events from -kafka-ingest-topic, produce every change this node makes to -kafka-changes-topic")
	kafkaIngest := fset.String("kafka-ingest-topic", kafka.DefaultIngestTopic, "with -kafka-brokers: the topic of session events (as on presence.ingest.>, keyed by user id) the nodes consume in the group -kafka-group; empty (-kafka-ingest-topic=): no consumer")
	kafkaGroup := fset.String("kafka-group", kafka.DefaultGroup, "with -kafka-brokers: the consumer group every node joins")
	kafkaChanges := fset.String("kafka-changes-topic", kafka.DefaultChangesTopic, "with -kafka-brokers: the topic every change this node makes is produced to, keyed by user id; empty (-kafka-changes-topic=): no producer")
	fset.Usage = func() {
		fmt.Fprintf(stderr, "Usage: presenced [flags]\n\nEvery flag can also be set by its environment variable, e.g. -heartbeat-ttl by %s.\n\n", envName("heartbeat-ttl"))
		fset.PrintDefaults()
	}
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fset.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fset.Args())
	}
	// Environment variables fill the flags not given on the command line.
	given := map[string]bool{}
	fset.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var envErr error
	fset.VisitAll(func(f *flag.Flag) {
		if f.Name == "print-token" || f.Name == "version" || f.Name == "healthcheck" {
			return // an action, not a setting
		}
		if v := getenv(envName(f.Name)); v != "" && !given[f.Name] {
			if err := f.Value.Set(v); err != nil && envErr == nil {
				envErr = fmt.Errorf("%s=%q: %v", envName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		return envErr
	}

	if *showVersion {
		fmt.Fprintln(stdout, "presenced", version())
		return nil
	}
	if *healthURL != "" {
		return healthcheck(ctx, *healthURL, stdout)
	}
	if *printToken != "" {
		if err := presence.ValidateID(*printToken); err != nil {
			return fmt.Errorf("-print-token %q: %v", *printToken, err)
		}
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("-log-level: %v", err)
	}
	var handler slog.Handler
	switch *logFormat {
	case "text":
		handler = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})
	case "json":
		handler = slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})
	default:
		return fmt.Errorf("-log-format %q: text or json", *logFormat)
	}
	log := slog.New(handler)
	log.Info("presenced", "version", version())

	poll := *pollInterval
	if poll == 0 {
		poll = -1
	}
	if *dev && !given["addr"] && getenv(envName("addr")) == "" {
		*addr = "127.0.0.1:8080" // an insecure node listens on loopback unless told otherwise
	}
	if *maxDevices < 1 || *maxDevices > presence.MaxMaxDevices {
		return fmt.Errorf("-max-devices %d: between 1 and %d", *maxDevices, presence.MaxMaxDevices)
	}
	if *maxSubs < 1 {
		return fmt.Errorf("-max-subscriptions %d: at least 1", *maxSubs)
	}
	if *maxUserSubs == 0 {
		*maxUserSubs = 10 * *maxSubs
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"max-user-subscriptions", *maxUserSubs}, {"max-sockets-per-user", *maxUserSocks}, {"max-sockets-per-device", *maxDevSocks}} {
		if f.v < 1 {
			return fmt.Errorf("-%s %d: at least 1", f.name, f.v)
		}
	}
	if *maxUserSubs < *maxSubs {
		return fmt.Errorf("-max-user-subscriptions %d is below -max-subscriptions %d: one connection could not use its own cap", *maxUserSubs, *maxSubs)
	}
	if *asyncFanout < 1 {
		return fmt.Errorf("-fanout-async-threshold %d: at least 1", *asyncFanout)
	}
	// The connection caps: app takes 0 for its default (the per-address
	// and pending caps derive from the -max-conns in force), a negative
	// value for no cap.
	set := func(name string) bool { return given[name] || getenv(envName(name)) != "" }
	for _, f := range []struct {
		name string
		v    *int
	}{{"max-conns", maxConns}, {"max-conns-per-ip", maxConnsIP}, {"max-pending-conns", maxPending}} {
		switch {
		case *f.v < 0:
			return fmt.Errorf("-%s %d: 0 (no cap) or more", f.name, *f.v)
		case *f.v == 0 && set(f.name):
			*f.v = -1 // no cap
		}
	}
	if *dev && !set("max-conns-per-ip") {
		*maxConnsIP = -1 // development: every client is this machine
	}
	if *headerTO < 100*time.Millisecond {
		return fmt.Errorf("-header-timeout %s: at least 100ms", *headerTO)
	}
	if *maxHeader < 4096 {
		return fmt.Errorf("-max-header-bytes %d: at least 4096", *maxHeader)
	}
	if *maxTokenLife < time.Second {
		return fmt.Errorf("-max-token-lifetime %s: at least 1s", *maxTokenLife)
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		return errors.New("-tls-cert and -tls-key go together: give both, or neither for plain HTTP")
	}
	if *tlsCert != "" && *printToken == "" {
		// Checked before anything is written; the node loads it again.
		if _, err := tlscert.Load(*tlsCert, *tlsKey, nil); err != nil {
			return fmt.Errorf("-tls-cert/-tls-key: %w", err)
		}
	}
	origins, err := origin.Parse(allowedOrigins)
	if err != nil {
		return fmt.Errorf("-allowed-origins: %v", err)
	}
	if origins.Any() {
		log.Warn("-allowed-origins *: pages of every origin may call this node")
	}
	if _, err := origin.NewHosts(origin.HostConfig{Allowed: allowedHosts}); err != nil {
		return fmt.Errorf("-allowed-hosts: %v", err)
	}
	if slices.Contains(allowedHosts, "*") && *dev {
		log.Warn("-allowed-hosts * under -dev: a page whose name is pointed at this node's address (DNS rebinding) may act for anybody")
	}
	cfg := app.Config{
		MaxDevices:           *maxDevices,
		MaxSubscriptions:     *maxSubs,
		MaxUserSubscriptions: *maxUserSubs,
		MaxSocketsPerUser:    *maxUserSocks,
		MaxSocketsPerDevice:  *maxDevSocks,
		FanoutAsyncThreshold: *asyncFanout,
		Addr:                 *addr,
		DataDir:              *dataDir,
		TTL:                  *ttl,
		IdleAfter:            *idleAfter,
		CloseGrace:           *closeGrace,
		PollInterval:         poll,
		Dev:                  *dev,
		MaxTokenLifetime:     *maxTokenLife,
		TokenAudience:        *tokenAud,
		TokenIssuer:          *tokenIss,
		Logger:               log,
		RedisURL:             *redisURL,
		RedisPrefix:          *redisPrefix,
		RedisBuckets:         *redisBuckets,
		PostgresURL:          *postgresURL,
		NATSURL:              *natsURL,
		NodeID:               *nodeID,
		NoIngest:             *noIngest,
		ReadReplica:          *readReplica,
		MaxConns:             *maxConns,
		MaxConnsPerAddr:      *maxConnsIP,
		MaxPendingConns:      *maxPending,
		HeaderTimeout:        *headerTO,
		MaxHeaderBytes:       *maxHeader,
		HealthAddr:           *healthAddr,
		WebhookURLs:          webhookURLs,
		WebhookSecret:        []byte(*webhookSecret),
		KafkaBrokers:         kafkaBrokers,
		KafkaIngestTopic:     *kafkaIngest,
		KafkaGroup:           *kafkaGroup,
		KafkaChangesTopic:    *kafkaChanges,
		NoKafkaIngest:        *kafkaIngest == "",
		NoKafkaChanges:       *kafkaChanges == "",
		AllowedOrigins:       allowedOrigins,
		AllowedHosts:         allowedHosts,
		TLSCertFile:          *tlsCert,
		TLSKeyFile:           *tlsKey,
	}
	if len(kafkaBrokers) > 0 && *kafkaGroup == "" {
		return errors.New("-kafka-group: give the consumer group's name")
	}
	if *redisURL != "" && !*dev && (*apiKey == "" || *jwtSecret == "") && *printToken == "" {
		return errors.New("-redis-url: give -api-key and -jwt-secret (or their environment variables): every node must accept the same credentials")
	}
	if err := cfg.ValidateTiming(); err != nil {
		return err // before anything is written to the data directory
	}
	if _, err := cfg.ConnCaps(); err != nil {
		return err // likewise
	}
	if !*dev {
		// Given credentials are checked before anything is written to the
		// data directory, stored ones once they are read.
		for _, f := range [...]struct{ name, value string }{{"api-key", *apiKey}, {"jwt-secret", *jwtSecret}} {
			if f.value != "" {
				if err := checkSecret(f.name, f.value, f.value, *dataDir); err != nil {
					return err
				}
			}
		}
	}
	if err := os.MkdirAll(*dataDir, 0o755); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	key, err := secret(*apiKey, filepath.Join(*dataDir, "api-key"), log)
	if err != nil {
		return err
	}
	jwtKey, err := secret(*jwtSecret, filepath.Join(*dataDir, "jwt-secret"), log)
	if err != nil {
		return err
	}
	if !*dev {
		// A short key is guessable and a short HS256 secret below the
		// algorithm's strength (RFC 7518 §3.2); generated ones are 48 bytes.
		if err := checkSecret("api-key", *apiKey, key, *dataDir); err != nil {
			return err
		}
		if err := checkSecret("jwt-secret", *jwtSecret, jwtKey, *dataDir); err != nil {
			return err
		}
	}
	if *printToken != "" {
		t := auth.Token{User: *printToken, Audience: *tokenAud, Issuer: *tokenIss}
		tok, err := t.Sign([]byte(jwtKey), time.Now(), *maxTokenLife)
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, tok)
		return nil
	}
	if *dev {
		log.Warn("INSECURE DEVELOPMENT MODE (-dev): requests without credentials are accepted for any user id. Never use it in production.")
	}
	cfg.APIKey, cfg.JWTSecret = key, []byte(jwtKey)
	var hup chan os.Signal
	if *tlsCert != "" {
		// Taken before the node exists, so that an early SIGHUP does not
		// end the process (its default action); handled once it runs.
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}
	// OpenTelemetry traces, exported over OTLP only when the standard
	// OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variables name a collector.
	stopTracing, err := tracing.Setup(ctx, getenv)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(sctx); err != nil {
			log.Warn("tracing: spans not exported at shutdown", "err", err)
		}
	}()
	if tracing.On() {
		log.Info("tracing: exporting spans over OTLP")
	}
	a, err := app.New(ctx, cfg)
	if err != nil {
		return err
	}
	if hup != nil {
		done := make(chan struct{})
		reloaded := make(chan struct{})
		defer func() { close(done); <-reloaded }()
		go func() {
			defer close(reloaded)
			for {
				select {
				case <-hup:
					log.Info("SIGHUP: loading the TLS certificate again", "cert", *tlsCert, "key", *tlsKey)
					_ = a.ReloadTLS() // logged either way; a bad pair keeps the one in use
				case <-done:
					return
				}
			}
		}()
	}
	if *pprofAddr != "" {
		stop, err := servePprof(*pprofAddr, log)
		if err != nil {
			a.Close()
			return err
		}
		defer stop()
	}
	return a.Run(ctx, nil)
}

// secret returns the given value, or the one stored in path, or a new
// random one written to path (mode 0600) so that it survives restarts.
func secret(given, path string, log *slog.Logger) (string, error) {
	if given != "" {
		return given, nil
	}
	b, err := os.ReadFile(path)
	if err == nil {
		if s := strings.TrimSpace(string(b)); s != "" {
			return s, nil
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	s := hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(s+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	log.Info("generated a new secret", "file", path)
	return s, nil
}

// checkSecret refuses a credential shorter than auth.MinSecretLen, naming
// where it came from: the flag or its environment variable (given), or
// the file under the data directory.
func checkSecret(flagName, given, value, dataDir string) error {
	err := auth.CheckSecret([]byte(value))
	if err == nil {
		return nil
	}
	if given != "" {
		return fmt.Errorf("-%s (%s) is %w", flagName, envName(flagName), err)
	}
	return fmt.Errorf("%s (the stored -%s) is %w; give a longer one with -%s, or remove the file to have one generated", filepath.Join(dataDir, flagName), flagName, err, flagName)
}

// servePprof serves net/http/pprof on addr, which must be a loopback
// address: profiles show user ids and more. stop shuts it down.
func servePprof(addr string, log *slog.Logger) (stop func(), err error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("-pprof-addr %q: %v", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("-pprof-addr %q: only a loopback address (profiles reveal user data)", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-pprof-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	log.Info("profiling endpoints", "addr", ln.Addr().String())
	return func() {
		srv.Close()
		<-done
	}, nil
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

// version is the module version the binary was built from (or "devel"),
// its VCS revision and time when known, and the Go release: the same
// build information /metrics exports as presenced_build_info.
func version() string { return buildinfo.Read().String() }

// healthcheck GETs url and succeeds only on a 200 answer: the container
// image's HEALTHCHECK (the image holds the binary alone, no curl).
func healthcheck(ctx context.Context, url string, stdout io.Writer) error {
	u, err := neturl.Parse(url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("-healthcheck %q: give an http:// or https:// URL, e.g. http://127.0.0.1:8081/healthz", url)
	}
	ctx, cancel := context.WithTimeout(ctx, healthcheckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("-healthcheck: %v", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("-healthcheck: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("-healthcheck %s: %s %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	fmt.Fprintf(stdout, "%s: %s %s\n", url, resp.Status, strings.TrimSpace(string(body)))
	return nil
}

// healthcheckTimeout bounds -healthcheck's request (a container engine
// kills a check that outlives its own timeout anyway).
const healthcheckTimeout = 5 * time.Second

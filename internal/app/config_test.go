package app_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/app"
	"github.com/presenced/presenced/internal/connbudget"
)

// TestCredentialRules: outside development mode a node refuses an API key
// or JWT secret shorter than 32 bytes, and a negative token lifetime;
// under -dev short ones are taken. A read replica without the backends it
// mirrors is refused too, and so are webhooks where nothing durable
// would feed them (PostgreSQL without NATS).
func TestCredentialRules(t *testing.T) {
	short := strings.Repeat("x", 31)
	for _, tc := range []struct {
		name string
		cfg  app.Config
		want string // "" : starts
	}{
		{"short API key", app.Config{APIKey: short, JWTSecret: testSecret}, "API key: 31 bytes long; at least 32 bytes are required outside -dev"},
		{"short JWT secret", app.Config{APIKey: testKey, JWTSecret: []byte("s")}, "JWT secret: 1 bytes long; at least 32 bytes"},
		{"no JWT secret, a long key", app.Config{APIKey: testKey}, ""},
		{"no API key, a long secret", app.Config{JWTSecret: testSecret}, ""},
		{"short ones under dev", app.Config{APIKey: "k", JWTSecret: []byte("s"), Dev: true}, ""},
		{"negative token lifetime", app.Config{APIKey: testKey, MaxTokenLifetime: -time.Hour}, "maximum token lifetime -1h0m0s is negative"},
		{"a read replica on an embedded node", app.Config{APIKey: testKey, ReadReplica: true}, "a read replica needs Redis and NATS"},
		{"negative redis buckets", app.Config{APIKey: testKey, RedisBuckets: -1}, "redis buckets -1: want 1 to"},
		{"too many redis buckets", app.Config{APIKey: testKey, RedisBuckets: 1<<20 + 1}, "redis buckets 1048577: want 1 to"},
		{"a read replica without NATS", app.Config{APIKey: testKey, ReadReplica: true, RedisURL: "redis://127.0.0.1:1/0"}, "a read replica needs Redis and NATS"},
		{"webhooks on PostgreSQL without NATS", app.Config{APIKey: testKey, PostgresURL: "postgres://127.0.0.1:1/x",
			WebhookURLs: []string{"https://app.example/presence"}, WebhookSecret: testSecret}, "webhooks with PostgreSQL need NATS (-nats-url)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.DataDir, tc.cfg.PollInterval = t.TempDir(), -1
			a, err := app.New(context.Background(), tc.cfg)
			if err == nil {
				a.Close()
			}
			if tc.want == "" {
				if err != nil {
					t.Fatalf("New: %v, want a node", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestConnCaps: the per-address and pending caps default to their shares
// of the MaxConns in force; a negative cap is none; a per-address or
// pending cap above MaxConns is refused.
func TestConnCaps(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  app.Config
		want connbudget.Config
		err  string
	}{
		{"shares of MaxConns", app.Config{MaxConns: 100}, connbudget.Config{Max: 100, PerAddr: 25, Pending: 16}, ""},
		{"one given", app.Config{MaxConns: 2000, MaxConnsPerAddr: 30}, connbudget.Config{Max: 2000, PerAddr: 30, Pending: 250}, ""},
		{"no per-address cap", app.Config{MaxConns: 2000, MaxConnsPerAddr: -1}, connbudget.Config{Max: 2000, PerAddr: 0, Pending: 250}, ""},
		{"no cap at all", app.Config{MaxConns: -1}, connbudget.Config{PerAddr: connbudget.Defaults(connbudget.FileLimit()).PerAddr, Pending: connbudget.Defaults(connbudget.FileLimit()).Pending}, ""},
		{"the file limit's", app.Config{}, connbudget.Defaults(connbudget.FileLimit()), ""},
		{"per-address above", app.Config{MaxConns: 100, MaxConnsPerAddr: 101}, connbudget.Config{}, "connections per address 101 (-max-conns-per-ip) above the 100 of the node"},
		{"pending above", app.Config{MaxConns: 100, MaxPendingConns: 200}, connbudget.Config{}, "pending connections 200 (-max-pending-conns) above the 100 of the node"},
	} {
		got, err := tc.cfg.ConnCaps()
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v %v, want %+v", tc.name, got, err, tc.want)
		}
	}
}

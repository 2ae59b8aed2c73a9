package pgstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Temporary: the machine's PostgreSQL until internal/testsvc lands.
const adminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

var dbSeq atomic.Int64

func newDatabase(tb testing.TB) string {
	tb.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("pgstore_%d_%d", time.Now().UnixNano(), dbSeq.Add(1))
	c, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			return
		}
		defer c.Close(ctx)
		c.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
	})
	return fmt.Sprintf("postgres://postgres@127.0.0.1:5432/%s?sslmode=disable", name)
}

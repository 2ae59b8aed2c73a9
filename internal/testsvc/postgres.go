package testsvc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgBinDirs are where Debian's postgresql-NN packages put the server,
// newest first.
func pgBinDirs() []string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(d string) int {
		n, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
		return n
	}
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	return dirs
}

// findPostgres returns the directory holding initdb and postgres of one
// installation.
func findPostgres() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	dirs := pgBinDirs()
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
				return d, nil
			}
		}
	}
	if len(dirs) == 0 {
		dirs = []string{"/usr/lib/postgresql/*/bin"}
	}
	return "", missing("initdb and postgres", "postgresql", dirs)
}

// unprivileged returns the credential a PostgreSQL process runs with: none
// (ours) unless we are root, which PostgreSQL refuses, and then the
// postgres OS user's.
func unprivileged() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, &notInstalledError{fmt.Sprintf("testsvc: the tests run as root, which PostgreSQL refuses, and there is no postgres OS user to run it as (%v); install Debian's package \"postgresql\", which creates it, or run the tests as another user", err)}
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("testsvc: postgres OS user has uid %q gid %q", u.Uid, u.Gid)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
}

// StartPostgres initdbs a cluster into a new temporary directory (trust
// auth, superuser postgres, fsync off: a killed server keeps every commit,
// a crashed machine would not) and starts postgres on a free
// 127.0.0.1 port, its socket in that directory. The caller Closes it.
func StartPostgres() (*Server, error) {
	bin, err := findPostgres()
	if err != nil {
		return nil, err
	}
	sp := spec{
		kind:    "postgres",
		notRoot: true,
		args: func(s *Server) []string {
			return []string{filepath.Join(bin, "postgres"),
				"-D", filepath.Join(s.Dir, "data"),
				"-p", strconv.Itoa(s.Port),
				"-k", s.Dir,
				"-c", "listen_addresses=127.0.0.1",
				"-c", "fsync=off",
				"-c", "full_page_writes=off",
				"-c", "max_connections=300",
				"-c", "shared_buffers=64MB",
				"-c", "log_min_messages=warning",
			}
		},
		ready:   pgReady,
		stopSig: syscall.SIGINT, // fast shutdown: SIGTERM would wait for clients
	}
	setup := func(s *Server) error { return clusterFromTemplate(bin, s.Dir) }
	return startNew(sp, setup, func(s *Server) string { return pgURL(s.Addr, "postgres") })
}

func pgURL(addr, db string) string {
	return "postgres://postgres@" + addr + "/" + db + "?sslmode=disable"
}

// pgTemplate is a cluster that initdb made once in this test binary, which
// every PostgreSQL server of the binary starts from as a copy: a copy takes
// a fraction of initdb's second.
var pgTemplate struct {
	once sync.Once
	dir  string // holds data/
	err  error
}

// clusterFromTemplate makes dir/data a copy of this binary's template
// cluster, making the template first if need be.
func clusterFromTemplate(bin, dir string) error {
	pgTemplate.once.Do(func() {
		d, err := os.MkdirTemp(tempRoot(), "presenced-testsvc-pgtemplate-")
		if err != nil {
			pgTemplate.err = fmt.Errorf("testsvc: %w", err)
			return
		}
		if err := markOwner(d); err != nil {
			pgTemplate.err = err
			return
		}
		pgTemplate.dir, pgTemplate.err = d, initdb(bin, d)
	})
	if pgTemplate.err != nil {
		return pgTemplate.err
	}
	cred, err := unprivileged()
	if err != nil {
		return err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("testsvc: %w", err)
		}
	}
	// cp -a keeps the owner (postgres, when we are root) and the modes
	// PostgreSQL insists on.
	out, err := exec.Command("cp", "-a", filepath.Join(pgTemplate.dir, "data"), filepath.Join(dir, "data")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("testsvc: copy the template cluster: %v: %s", err, out)
	}
	return nil
}

// removePgTemplate removes this binary's template cluster.
func removePgTemplate() {
	if pgTemplate.dir != "" {
		os.RemoveAll(pgTemplate.dir)
	}
}

// initdb makes a cluster in dir/data, owned by the user postgres runs as.
func initdb(bin, dir string) error {
	cred, err := unprivileged()
	if err != nil {
		return err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("testsvc: %w", err)
		}
	}
	cmd := exec.Command(filepath.Join(bin, "initdb"),
		"-D", filepath.Join(dir, "data"), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--no-locale", "-N")
	cmd.Dir = dir
	cmd.Env = serverEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("testsvc: initdb: %v:\n%s", err, tail(out, 20))
	}
	return nil
}

func pgReady(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, pgURL(addr, "postgres")+"&connect_timeout=1")
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	var one int
	return c.QueryRow(ctx, "SELECT 1").Scan(&one)
}

// Postgres starts a private PostgreSQL for tb, closed at tb's cleanup. What
// it committed survives Stop/Start and Kill/Start (crash recovery).
func Postgres(tb testing.TB) *Server {
	tb.Helper()
	return fromTB(tb, StartPostgres)
}

// SharedPostgres returns this test binary's shared PostgreSQL, starting it
// on first use. Tests isolate themselves with s.NewDatabase(t) and cannot
// stop it. The package's TestMain calls Main.
func SharedPostgres(tb testing.TB) *Server {
	tb.Helper()
	return getShared(tb, "postgres", StartPostgres)
}

// NewDatabase creates an empty database named for tb and returns its URL;
// the database is dropped at tb's cleanup (forcibly, closing connections
// left open).
func (s *Server) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := Unique(tb)
	url, err := s.CreateDatabase(name)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.DropDatabase(name); err != nil && s.Running() {
			tb.Errorf("testsvc: %v", err)
		}
	})
	return url
}

// CreateDatabase creates an empty database name ([a-z0-9_] only) and
// returns its URL.
func (s *Server) CreateDatabase(name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	if err := s.admin("CREATE DATABASE " + name); err != nil {
		return "", fmt.Errorf("testsvc: create database %s: %w", name, err)
	}
	return pgURL(s.Addr, name), nil
}

// DropDatabase drops database name, closing the connections left to it.
func (s *Server) DropDatabase(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := s.admin("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
		return fmt.Errorf("testsvc: drop database %s: %w", name, err)
	}
	return nil
}

func checkName(name string) error {
	if name == "" || len(name) > 63 || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" || name[0] >= '0' && name[0] <= '9' {
		return fmt.Errorf("testsvc: bad database name %q: want 1-63 of [a-z0-9_], not starting with a digit", name)
	}
	return nil
}

// admin runs one statement on the postgres database.
func (s *Server) admin(sql string) error {
	if s.Kind != "postgres" {
		return fmt.Errorf("testsvc: %s is not PostgreSQL", s.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, sql)
	return err
}

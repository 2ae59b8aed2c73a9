package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/presenced/presenced/internal/connbudget"
	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/wsaccept"
)

// listeners are what Run serves: the clients' HTTP server and its
// listener, and the health checks' own server (nil without HealthAddr).
type listeners struct {
	srv     *http.Server
	clients net.Listener
	health  *healthServer
}

// listen opens the listeners on ln (or on cfg.Addr when ln is nil): the
// Host names the node answers from the address it listens on, the
// clients' connection budget, TLS and the upgrades read off the listener,
// and the health listener. On failure nothing stays open of them.
func (a *App) listen(ln net.Listener) (*listeners, error) {
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", a.cfg.Addr); err != nil {
			return nil, fmt.Errorf("listen: %w", err)
		}
	}
	a.log.Info("presenced listening", "addr", ln.Addr().String(), "tls", a.cert != nil, "mode", a.cfg.Mode(), "data", a.cfg.DataDir,
		"ttl", a.cfg.TTL, "idle_after", a.cfg.IdleAfter, "close_grace", a.rules.CloseGrace)
	hosts, err := a.hostsFor(ln.Addr().String())
	if err != nil { // checked by New already
		ln.Close()
		return nil, fmt.Errorf("allowed hosts: %w", err)
	}
	a.hosts.Store(hosts)
	a.log.Info("answering Host names", "hosts", hosts.String())
	if a.cert != nil {
		leaf := a.cert.Certificate().Leaf
		a.log.Info("serving HTTPS and WSS", "subject", leaf.Subject.String(), "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter)
	}
	l := a.clients(ln)
	if a.cfg.HealthAddr != "" {
		if l.health, err = a.serveHealth(); err != nil {
			ln.Close()
			return nil, err
		}
	}
	return l, nil
}

// clients wraps ln for the clients. The budget counts TCP connections,
// before any TLS handshake, and bounds the time from the accept to the
// end of the first request's head (handshake included) by HeaderTimeout;
// the TLS listener goes around it. WebSocket upgrades are read off the
// listener before net/http sees the connection (wsaccept: no net/http
// reader, writer or response left behind per socket); everything else
// goes on to net/http.
func (a *App) clients(ln net.Listener) *listeners {
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
	// Room for every connection the budget allows, and the reserve
	// connbudget.Defaults keeps beside them, in the descriptor table.
	table, err := connbudget.ReserveFiles(a.cfg.MaxConns + max(100, a.cfg.MaxConns/16))
	if err != nil {
		a.log.Warn("could not grow the file descriptor table up front; bursts of connections may start extra OS threads", "err", err)
	}
	a.log.Info("connection budget", "max", a.cfg.MaxConns, "per_address", a.cfg.MaxConnsPerAddr,
		"pending", a.cfg.MaxPendingConns, "file_limit", connbudget.FileLimit(), "file_table", table)
	a.budget.Store(budget)
	return &listeners{srv: a.httpServer(a.handler, budget), clients: accept}
}

// healthServer serves /healthz, /readyz and /metrics on HealthAddr until
// close.
type healthServer struct {
	srv  *http.Server
	done chan struct{} // closed when Serve returned
}

// serveHealth listens on HealthAddr, outside the clients' budget (a
// small one of its own: probes are few), and serves there.
func (a *App) serveHealth() (*healthServer, error) {
	hln, err := net.Listen("tcp", a.cfg.HealthAddr)
	if err != nil {
		return nil, fmt.Errorf("listen for health checks: %w", err)
	}
	hb := connbudget.New(hln, connbudget.Config{Max: 128, Pending: 32, HeaderTimeout: a.cfg.HeaderTimeout,
		MaxHeaderBytes: a.cfg.MaxHeaderBytes, Logger: a.log})
	h := &healthServer{srv: a.httpServer(healthOnly(a.handler), hb), done: make(chan struct{})}
	a.log.Info("health checks listening", "addr", hln.Addr().String())
	go func() {
		defer close(h.done)
		if err := h.srv.Serve(hb); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Warn("health listener stopped", "err", err)
		}
	}()
	return h, nil
}

// close stops serving and waits for Serve to return; h may be nil.
func (h *healthServer) close() {
	if h == nil {
		return
	}
	h.srv.Close()
	<-h.done
}

// serve takes requests once the gateway takes sockets, until ctx is done
// or the server fails; then it stops taking them and finishes those in
// flight, for at most ShutdownTimeout. Its error is the server's.
func (a *App) serve(ctx context.Context, l *listeners) error {
	select {
	case <-a.gw.Ready():
	case <-ctx.Done():
	}
	served := make(chan error, 1)
	go func() { served <- l.srv.Serve(l.clients) }() // received below
	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
		served <- err
	}
	a.log.Info("presenced shutting down")
	a.api.Drain()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.ShutdownTimeout)
	defer cancel()
	if serr := l.srv.Shutdown(sctx); serr != nil {
		a.log.Warn("http shutdown", "err", serr)
		l.srv.Close()
	}
	if serr := <-served; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
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

package app

import (
	"bufio"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/presenced/presenced/internal/apierr"
	"github.com/presenced/presenced/internal/gateway"
	"github.com/presenced/presenced/internal/origin"
)

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

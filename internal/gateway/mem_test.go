package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/presenced/presenced/internal/auth"
	"github.com/presenced/presenced/internal/testwait"
	"github.com/presenced/presenced/internal/tlscert"
	"github.com/presenced/presenced/internal/tlscert/tlstest"
)

// BenchmarkIdleConnection measures the server's user-space memory (heap and
// goroutine stacks) per idle WebSocket connection, with the clients in a
// separate process so only the server is counted:
//
//	go test -run XXX -bench IdleConnection ./internal/gateway
//	GW_NOEPOLL=1 go test -run XXX -bench IdleConnection ./internal/gateway  # the portable path
//	GW_TLS=1 go test -run XXX -bench IdleConnection ./internal/gateway      # WSS (-tls-cert)
func BenchmarkIdleConnection(b *testing.B) {
	const conns = 5000
	noEpoll := os.Getenv("GW_NOEPOLL") != ""
	useTLS := os.Getenv("GW_TLS") != ""
	g, err := New(Config{Tracker: nopTracker{}, Reader: nopReader{}, Auth: auth.New(auth.Config{Dev: true}), NoEpoll: noEpoll})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { _ = g.Run(ctx); close(runDone) }()
	defer func() { cancel(); <-runDone }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: g}
	var caFile string
	if useTLS {
		ca := tlstest.NewCA(b)
		dir := b.TempDir()
		certFile, keyFile := ca.Issue(b, dir, "node", 2)
		store, err := tlscert.Load(certFile, keyFile, nil)
		if err != nil {
			b.Fatal(err)
		}
		caFile = filepath.Join(dir, "ca.crt")
		ca.WriteCert(b, caFile)
		ln = tls.NewListener(ln, store.Config())
	}
	<-g.ready // Run takes connections
	// The baseline: memory before the server's accept loop starts
	// (nothing to wait for but a GC; its stack is a byte a connection),
	// goroutines with it.
	before := usage()
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	gBefore := runtime.NumGoroutine()

	cmd := exec.Command(os.Args[0], "-test.run=TestDialHelper", "-test.v")
	cmd.Env = append(os.Environ(), "GW_DIAL_ADDR="+ln.Addr().String(), "GW_DIAL_N="+strconv.Itoa(conns), "GW_DIAL_CA="+caFile)
	stdin, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "dialed" {
	}
	testwait.For(b, "every connection open", func() bool { return g.Stats().Connections >= conns })
	testwait.For(b, "the writers of the welcomes to end", func() bool { return Writing(g) == 0 })
	after := usage()
	per := float64(after-before) / conns
	b.ReportMetric(per, "B/conn")
	b.ReportMetric(float64(runtime.NumGoroutine()-gBefore)/conns, "goroutines/conn")
	stdin.Close()
	_ = cmd.Wait()
}

// usage is the heap in use plus goroutine stacks, after a GC.
func usage() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}

// TestDialHelper is the client process of BenchmarkIdleConnection.
func TestDialHelper(t *testing.T) {
	addr := os.Getenv("GW_DIAL_ADDR")
	if addr == "" {
		t.Skip("helper process of BenchmarkIdleConnection")
	}
	n, _ := strconv.Atoi(os.Getenv("GW_DIAL_N"))
	conns := make([]net.Conn, 0, n)
	var tlsConf *tls.Config
	if f := os.Getenv("GW_DIAL_CA"); f != "" {
		pem, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		tlsConf = &tls.Config{RootCAs: x509.NewCertPool()}
		tlsConf.RootCAs.AppendCertsFromPEM(pem)
	}
	for i := range n {
		var c net.Conn
		var err error
		if tlsConf != nil {
			c, err = tls.Dial("tcp", addr, tlsConf)
		} else {
			c, err = net.Dial("tcp", addr)
		}
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET /v1/ws?user_id=u%d&device_id=d HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", i)
		conns = append(conns, c)
	}
	fmt.Println("dialed")
	var buf [1]byte
	_, _ = os.Stdin.Read(buf[:])
	for _, c := range conns {
		c.Close()
	}
}

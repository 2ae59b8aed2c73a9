package testsvc_test

import (
	"bufio"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/testsvc"
)

// redisSeq sends inline commands on one connection and returns their
// replies: a bulk string as its text, any other reply as its line.
func redisSeq(t *testing.T, addr string, cmds ...string) []string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	var out []string
	for _, cmd := range cmds {
		if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
			t.Fatal(err)
		}
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		line = strings.TrimSpace(line)
		if n, err := strconv.Atoi(strings.TrimPrefix(line, "$")); strings.HasPrefix(line, "$") && err == nil && n >= 0 {
			b := make([]byte, n+2)
			if _, err := io.ReadFull(r, b); err != nil {
				t.Fatal(err)
			}
			line = string(b[:n])
		}
		out = append(out, line)
	}
	return out
}

// addrs names servers for messages.
func addrs(ss []*testsvc.Server) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Addr)
	}
	return out
}

// KeySlot is checked against Redis itself in TestRedisClusterReplicas;
// here, without a server, against CRC16/XMODEM's check value and the
// hash tag example of the Cluster specification.
func TestKeySlot(t *testing.T) {
	if got, want := testsvc.KeySlot("123456789"), 0x31C3; got != want {
		t.Errorf("KeySlot(123456789) = %d, want %d", got, want)
	}
	if a, b := testsvc.KeySlot("{user1000}.following"), testsvc.KeySlot("{user1000}.followers"); a != b {
		t.Errorf("{user1000}.following in slot %d, {user1000}.followers in %d", a, b)
	}
}

// A cluster of masters with replicas: every master has its replica, the
// slots are served, KeySlot agrees with Redis, and a write on the master
// reaches the replica (WaitReplicated).
func TestRedisClusterReplicas(t *testing.T) {
	t.Parallel()
	c := testsvc.RedisClusterReplicas(t, 3, 1)
	if len(c.Nodes) != 6 || len(c.Addrs) != 6 {
		t.Fatalf("%d nodes, %d addrs, want 6", len(c.Nodes), len(c.Addrs))
	}
	want := "redis://" + c.Addrs[0]
	for i, a := range c.Addrs[1:] {
		want += map[bool]string{true: "?", false: "&"}[i == 0] + "addr=" + a
	}
	if c.URL != want {
		t.Fatalf("URL %q, want %q", c.URL, want)
	}
	for i, m := range c.Nodes[:3] {
		reps, err := c.ReplicasOf(m)
		if err != nil {
			t.Fatal(err)
		}
		if len(reps) != 1 || reps[0] != c.Nodes[3+i] {
			t.Errorf("replicas of master %d: %v, want [%s]", i, addrs(reps), c.Addrs[3+i])
		}
	}
	if _, err := c.ReplicasOf(c.Nodes[3]); err == nil {
		t.Error("ReplicasOf a replica: no error")
	}
	// The hash tag rules of the Cluster specification: the first '{' to
	// the next '}', unless that is empty.
	for _, key := range []string{"a", "{user1}k", "presenced:{17}due", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "x}{"} {
		got := redisSeq(t, c.Addrs[4], "CLUSTER KEYSLOT "+key)[0]
		if want := ":" + strconv.Itoa(testsvc.KeySlot(key)); got != want {
			t.Errorf("CLUSTER KEYSLOT %s = %s, KeySlot %s", key, got, want)
		}
	}

	const key = "{user1}k"
	m, err := c.MasterOf(key)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range c.Nodes {
		got := redisDo(t, s.Addr, "SET "+key+" v")
		switch {
		case s == m && got != "+OK":
			t.Errorf("SET on the master %s: %q", s.Addr, got)
		case s != m && !strings.HasPrefix(got, "-MOVED "):
			t.Errorf("SET on %s, not the master: %q, want MOVED", s.Addr, got)
		}
	}
	if err := c.WaitReplicated(m, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	reps, err := c.ReplicasOf(m)
	if err != nil {
		t.Fatal(err)
	}
	if got := redisSeq(t, reps[0].Addr, "READONLY", "GET "+key); got[1] != "v" {
		t.Errorf("GET on the replica: %q, want v", got)
	}
}

// A killed master's replica is promoted with what was replicated, and the
// old master comes back as its replica.
func TestRedisClusterKillMaster(t *testing.T) {
	t.Parallel()
	c := testsvc.RedisClusterReplicas(t, 3, 1)
	const key = "{user2}k"
	m, err := c.MasterOf(key)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := c.ReplicasOf(m)
	if err != nil {
		t.Fatal(err)
	}
	if got := redisDo(t, m.Addr, "SET "+key+" v"); got != "+OK" {
		t.Fatalf("SET: %q", got)
	}
	if err := c.WaitReplicated(m, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := m.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Rejoin(m, time.Second); err == nil {
		t.Fatal("Rejoin before the replica was promoted: no error")
	}
	nm, err := c.WaitPromoted(m, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if nm != reps[0] {
		t.Fatalf("promoted %s, want the replica %s", nm.Addr, reps[0].Addr)
	}
	if got, err := c.MasterOf(key); err != nil || got != nm {
		t.Fatalf("MasterOf after the failover: %v %v, want %s", got, err, nm.Addr)
	}
	if got := redisSeq(t, nm.Addr, "GET "+key); got[0] != "v" {
		t.Errorf("GET on the new master: %q, want v", got)
	}

	if err := c.Rejoin(m, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Rejoin(m, time.Second); err == nil {
		t.Error("Rejoin of a running node: no error")
	}
	if got, err := c.ReplicasOf(nm); err != nil || !slices.Equal(got, []*testsvc.Server{m}) {
		t.Fatalf("replicas of the new master after Rejoin: %v %v, want [%s]", addrs(got), err, m.Addr)
	}
	// Restarted empty, it copied the new master's data.
	if got := redisSeq(t, m.Addr, "READONLY", "GET "+key); got[1] != "v" {
		t.Errorf("GET on the rejoined node: %q, want v", got)
	}
}

// A manual failover in a master with two replicas: the chosen replica
// takes over with every write acknowledged before, and the old master and
// the other replica follow it.
func TestRedisClusterFailover(t *testing.T) {
	t.Parallel()
	c := testsvc.RedisClusterReplicas(t, 1, 2)
	m, r, other := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	if reps, err := c.ReplicasOf(m); err != nil || !slices.Equal(reps, []*testsvc.Server{r, other}) {
		t.Fatalf("replicas: %v %v, want [%s %s]", addrs(reps), err, r.Addr, other.Addr)
	}
	if err := c.Failover(m, 5*time.Second); err == nil {
		t.Fatal("Failover to a master: no error")
	}
	var sets []string
	for i := range 100 {
		sets = append(sets, "SET k"+strconv.Itoa(i)+" v"+strconv.Itoa(i))
	}
	for i, got := range redisSeq(t, m.Addr, sets...) {
		if got != "+OK" {
			t.Fatalf("%s: %q", sets[i], got)
		}
	}
	// No WaitReplicated: a manual failover waits for the replica itself.
	if err := c.Failover(r, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, err := c.MasterOf("k0"); err != nil || got != r {
		t.Fatalf("MasterOf after the failover: %v %v, want %s", got, err, r.Addr)
	}
	if reps, err := c.ReplicasOf(r); err != nil || !slices.Equal(reps, []*testsvc.Server{m, other}) {
		t.Fatalf("replicas of the new master: %v %v, want [%s %s]", addrs(reps), err, m.Addr, other.Addr)
	}
	var gets []string
	for i := range 100 {
		gets = append(gets, "GET k"+strconv.Itoa(i))
	}
	for i, got := range redisSeq(t, r.Addr, gets...) {
		if want := "v" + strconv.Itoa(i); got != want {
			t.Errorf("%s on the new master: %q, want %q", gets[i], got, want)
		}
	}
}

// A cluster of one node, whose node was never met by another and so does
// not know its own address, is settled as well.
func TestRedisClusterOfOne(t *testing.T) {
	t.Parallel()
	c := testsvc.RedisCluster(t, 1)
	if m, err := c.MasterOf("k"); err != nil || m != c.Nodes[0] {
		t.Fatalf("MasterOf: %v %v, want %s", m, err, c.Addrs[0])
	}
}

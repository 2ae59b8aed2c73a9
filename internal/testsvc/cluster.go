package testsvc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// numSlots is the number of hash slots of a Redis Cluster.
const numSlots = 16384

// ReplicaNodeTimeout is the cluster-node-timeout of the nodes of a Cluster
// with replicas: how long a master must be unreachable before the others
// mark it failing and its replica is elected in its place (within about a
// second more: Redis waits 500–1000 ms before it asks for votes). It is
// short so that fault tests are quick, and long enough that a loaded test
// machine (a node starved of CPU for a moment) does not fail a healthy
// master over by itself. A Cluster of masters only has a 1 s timeout.
const ReplicaNodeTimeout = 2 * time.Second

// mfRetry is how long Failover waits before it asks again when a manual
// failover came to nothing (Redis gives one up after 5 s).
const mfRetry = 6 * time.Second

// clusterOptions returns the options of the nodes of a Cluster, besides
// cluster-enabled and its config file.
func clusterOptions(replicas bool) []string {
	if !replicas {
		return []string{"--cluster-node-timeout", "1000"}
	}
	return []string{
		"--cluster-node-timeout", strconv.Itoa(int(ReplicaNodeTimeout / time.Millisecond)),
		// A master down fails only the calls for its slots: the other
		// masters go on serving theirs (the default, yes, fails every
		// call until the failover), as the store's fault tests expect.
		"--cluster-require-full-coverage", "no",
		// A replica takes over however long it was cut off from its
		// master: the test decides what it kills, Redis does not second-guess it.
		"--cluster-replica-validity-factor", "0",
		// Replicas stay where they were put, so that the layout a test
		// reads is the one it gets.
		"--cluster-allow-replica-migration", "no",
		// A replica's full sync starts at once, not after 5 s of waiting
		// for others to share it.
		"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
	}
}

// Cluster is a Redis Cluster on 127.0.0.1: masters that split the 16384
// slots evenly between them, each with the same number of replicas (none
// for RedisCluster). Its fields are fixed; its methods are safe for
// concurrent use.
//
// The methods that read the cluster's layout (MasterOf, ReplicasOf, …)
// ask every running node and answer only when the cluster is settled
// (see WaitOK): during a failover they fail or wait.
type Cluster struct {
	// Nodes are every node, as formed: the masters first, then the
	// replicas of the first master, of the second, and so on. A failover
	// changes who is master; MasterOf and ReplicasOf tell. Stop, Kill,
	// Pause and Start act on one node.
	Nodes []*Server
	Addrs []string // the nodes' "127.0.0.1:port"
	// URL names every node: "redis://127.0.0.1:p1?addr=127.0.0.1:p2&addr=…".
	URL string

	index map[string]int // node's Addr → its index in Nodes

	mu   sync.Mutex // guards last
	last *layout    // the layout when the cluster was last seen settled
}

// layout is who serves what in a settled cluster.
type layout struct {
	owner  [numSlots]int16 // index in Nodes of each slot's master
	master []int           // per node: the index of its master if it is a running replica, else -1
}

// owns reports whether node i serves at least one slot.
func (l *layout) owns(i int) bool {
	for _, o := range l.owner {
		if int(o) == i {
			return true
		}
	}
	return false
}

// RedisCluster starts a private Redis Cluster of n masters (n ≥ 1) for tb,
// closed at tb's cleanup, and waits until every node reports
// cluster_state:ok. Nodes keep no data across a restart, but do keep their
// identity and slots (nodes.conf in their directories).
func RedisCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	return clusterFromTB(tb, func() (*Cluster, error) { return StartRedisCluster(n) })
}

// StartRedisCluster is RedisCluster without a testing.TB; the caller
// Closes it.
func StartRedisCluster(n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("testsvc: a Redis Cluster of %d nodes", n)
	}
	return startCluster(n, 0)
}

// RedisClusterReplicas starts a private Redis Cluster of masters masters
// (≥ 1), each with replicas replicas (≥ 1), for tb, closed at tb's
// cleanup, and waits until it is settled: every replica linked to its
// master and in sync. It takes about 2–3 s.
//
// Its nodes are made for fault tests (see ReplicaNodeTimeout): a killed
// master's replica takes over a few seconds later, and meanwhile only
// the calls for the killed master's slots fail
// (cluster-require-full-coverage no). Redis elects a replica with the
// votes of a majority of all masters, so a killed master is replaced only
// in a cluster of 3 masters or more; a manual Failover needs no more than
// one. Nodes keep no data across a restart: a restarted master (Rejoin)
// comes back as a replica and copies its data from the new master.
func RedisClusterReplicas(tb testing.TB, masters, replicas int) *Cluster {
	tb.Helper()
	return clusterFromTB(tb, func() (*Cluster, error) { return StartRedisClusterReplicas(masters, replicas) })
}

// StartRedisClusterReplicas is RedisClusterReplicas without a testing.TB;
// the caller Closes it.
func StartRedisClusterReplicas(masters, replicas int) (*Cluster, error) {
	if masters < 1 || replicas < 1 {
		return nil, fmt.Errorf("testsvc: a Redis Cluster of %d masters with %d replicas each", masters, replicas)
	}
	return startCluster(masters, replicas)
}

func clusterFromTB(tb testing.TB, start func() (*Cluster, error)) *Cluster {
	tb.Helper()
	c, err := start()
	if err != nil {
		Fatal(tb, err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			for _, s := range c.Nodes {
				tb.Logf("testsvc: last lines of redis cluster node %s:\n%s", s.Addr, s.LogTail(10))
			}
		}
		c.Close()
	})
	return c
}

// startCluster starts the nodes of a cluster and forms it.
func startCluster(masters, replicas int) (*Cluster, error) {
	opts := clusterOptions(replicas > 0)
	c := &Cluster{index: map[string]int{}}
	for i := range masters * (1 + replicas) {
		s, err := startRedis(opts)
		if err != nil {
			c.Close()
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
		c.Addrs = append(c.Addrs, s.Addr)
		c.index[s.Addr] = i
	}
	c.URL = "redis://" + c.Addrs[0]
	for i, a := range c.Addrs[1:] {
		if i == 0 {
			c.URL += "?"
		} else {
			c.URL += "&"
		}
		c.URL += "addr=" + a
	}
	if err := c.form(masters, replicas); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// form gives each master its slots and a config epoch of its own,
// introduces the nodes, makes each replica follow its master, and waits
// for the cluster to be settled.
func (c *Cluster) form(masters, replicas int) error {
	ids := make([]string, masters)
	for i, s := range c.Nodes[:masters] {
		// Distinct epochs from the start: no collision for Redis to
		// resolve while the first failover is counting votes.
		if _, err := redisCmd(s.Addr, "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1)); err != nil {
			return fmt.Errorf("testsvc: redis cluster: %w", err)
		}
		args := []string{"CLUSTER", "ADDSLOTS"}
		for slot := i * numSlots / masters; slot < (i+1)*numSlots/masters; slot++ {
			args = append(args, strconv.Itoa(slot))
		}
		if _, err := redisCmd(s.Addr, args...); err != nil {
			return fmt.Errorf("testsvc: redis cluster: %w", err)
		}
		id, err := redisCmd(s.Addr, "CLUSTER", "MYID")
		if err != nil {
			return fmt.Errorf("testsvc: redis cluster: %w", err)
		}
		ids[i] = id
	}
	for _, s := range c.Nodes[1:] {
		if _, err := redisCmd(c.Addrs[0], "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(s.Port)); err != nil {
			return fmt.Errorf("testsvc: redis cluster: %w", err)
		}
	}
	deadline := time.Now().Add(StartTimeout)
	for k, s := range c.Nodes[masters:] {
		master := ids[k/replicas]
		// A replica must have heard of its master before it can follow
		// it: until the handshake is done it answers "Unknown node".
		for {
			_, err := redisCmd(s.Addr, "CLUSTER", "REPLICATE", master)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("testsvc: redis cluster: node %s: %w", s.Addr, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return c.WaitOK(time.Until(deadline))
}

// WaitOK waits until the cluster is settled, for at most timeout: every
// running node reports cluster_state:ok, knows every node and sees none
// of the running ones failing; they agree on which master serves each
// slot; every slot's master is running; and every other running node is
// a replica whose link to its master is up. After a node's restart, say.
// (A stopped or killed replica does not keep a cluster from settling; a
// stopped or killed master does, until its replica took over.)
func (c *Cluster) WaitOK(timeout time.Duration) error {
	_, err := c.waitFor(time.Now().Add(timeout), nil)
	return err
}

// waitFor waits until the cluster is settled and cond (if not nil)
// returns nil for its layout, until deadline.
func (c *Cluster) waitFor(deadline time.Time, cond func(*layout) error) (*layout, error) {
	for {
		l, err := c.observe()
		if err == nil && cond != nil {
			err = cond(l)
		}
		if err == nil {
			return l, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("testsvc: redis cluster: %w", err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// MasterOf returns the master that serves key (see KeySlot). It fails if
// the cluster is not settled (a failover is under way: WaitOK or
// WaitPromoted first).
func (c *Cluster) MasterOf(key string) (*Server, error) {
	return c.MasterOfSlot(KeySlot(key))
}

// MasterOfSlot returns the master that serves slot. It fails if the
// cluster is not settled.
func (c *Cluster) MasterOfSlot(slot int) (*Server, error) {
	if slot < 0 || slot >= numSlots {
		return nil, fmt.Errorf("testsvc: redis cluster: no slot %d", slot)
	}
	l, err := c.observe()
	if err != nil {
		return nil, fmt.Errorf("testsvc: redis cluster: %w", err)
	}
	return c.Nodes[l.owner[slot]], nil
}

// ReplicasOf returns the running replicas of master, in the order of
// Nodes. It fails if master serves no slot or the cluster is not settled.
func (c *Cluster) ReplicasOf(master *Server) ([]*Server, error) {
	i, err := c.indexOf(master)
	if err != nil {
		return nil, err
	}
	l, err := c.observe()
	if err != nil {
		return nil, fmt.Errorf("testsvc: redis cluster: %w", err)
	}
	if !l.owns(i) {
		return nil, fmt.Errorf("testsvc: redis cluster: %s is not a master", master.Addr)
	}
	var out []*Server
	for j, m := range l.master {
		if m == i {
			out = append(out, c.Nodes[j])
		}
	}
	return out, nil
}

// WaitPromoted waits, for at most timeout, until the slots that old served
// when the cluster was last seen settled are served by another node — a
// replica of old elected after old was killed or stopped — and the
// cluster is settled again, and returns that node.
func (c *Cluster) WaitPromoted(old *Server, timeout time.Duration) (*Server, error) {
	i, err := c.indexOf(old)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	last := c.last
	c.mu.Unlock()
	slot := -1
	if last != nil {
		for s, o := range last.owner {
			if int(o) == i {
				slot = s
				break
			}
		}
	}
	if slot < 0 {
		return nil, fmt.Errorf("testsvc: redis cluster: %s was not a master when the cluster was last seen settled", old.Addr)
	}
	l, err := c.waitFor(time.Now().Add(timeout), func(l *layout) error {
		if int(l.owner[slot]) == i {
			return fmt.Errorf("%s is still the master of slot %d", old.Addr, slot)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c.Nodes[l.owner[slot]], nil
}

// Failover makes replica its master's master by a manual failover
// (CLUSTER FAILOVER: the master stops taking writes until the replica has
// all of them, so nothing acknowledged is lost) and waits, for at most
// timeout, until replica serves its old master's slots and the cluster is
// settled again, the old master now its replica. The cluster must be
// settled when it is called.
func (c *Cluster) Failover(replica *Server, timeout time.Duration) error {
	i, err := c.indexOf(replica)
	if err != nil {
		return err
	}
	l, err := c.observe()
	if err != nil {
		return fmt.Errorf("testsvc: redis cluster: failover to %s: %w", replica.Addr, err)
	}
	if l.master[i] < 0 {
		return fmt.Errorf("testsvc: redis cluster: failover to %s: not a replica", replica.Addr)
	}
	old := l.master[i]
	ask := func() error {
		if _, err := redisCmd(replica.Addr, "CLUSTER", "FAILOVER"); err != nil {
			return fmt.Errorf("testsvc: redis cluster: failover to %s: %w", replica.Addr, err)
		}
		return nil
	}
	if err := ask(); err != nil {
		return err
	}
	asked := time.Now()
	_, err = c.waitFor(time.Now().Add(timeout), func(l *layout) error {
		if l.owns(i) && l.master[old] == i {
			return nil
		}
		if !l.owns(i) && time.Since(asked) > mfRetry {
			// Still settled as before: Redis gave this failover up.
			if err := ask(); err != nil {
				return err
			}
			asked = time.Now()
		}
		return fmt.Errorf("%s has not taken over from %s yet", replica.Addr, c.Addrs[old])
	})
	return err
}

// Rejoin starts s, a stopped or killed node, again and waits, for at most
// timeout, until it is a replica in sync and the cluster is settled. A
// master killed and replaced by its replica (WaitPromoted) comes back as
// the new master's replica, empty, and copies its data. Rejoin refuses
// while the cluster is not settled: a master restarted before its replica
// was promoted would come back a master, empty, and its replica would
// copy the emptiness.
func (c *Cluster) Rejoin(s *Server, timeout time.Duration) error {
	i, err := c.indexOf(s)
	if err != nil {
		return err
	}
	if s.Running() {
		return fmt.Errorf("testsvc: redis cluster: rejoin %s: it is running", s.Addr)
	}
	if _, err := c.observe(); err != nil {
		return fmt.Errorf("testsvc: redis cluster: rejoin %s: not before the cluster is settled without it: %w", s.Addr, err)
	}
	if err := s.Start(); err != nil {
		return err
	}
	_, err = c.waitFor(time.Now().Add(timeout), func(l *layout) error {
		if l.master[i] < 0 {
			return fmt.Errorf("%s is not a replica yet", s.Addr)
		}
		return nil
	})
	return err
}

// WaitReplicated waits, for at most timeout, until every running replica
// of master has applied everything master had written when it was called,
// as WAIT does for one client's writes: what a test wrote before then
// survives master's death.
func (c *Cluster) WaitReplicated(master *Server, timeout time.Duration) error {
	reps, err := c.ReplicasOf(master)
	if err != nil {
		return err
	}
	if len(reps) == 0 {
		return fmt.Errorf("testsvc: redis cluster: %s has no running replica", master.Addr)
	}
	info, err := redisCmd(master.Addr, "INFO", "replication")
	if err != nil {
		return fmt.Errorf("testsvc: redis cluster: %w", err)
	}
	want, err := infoInt(info, "master_repl_offset")
	if err != nil {
		return fmt.Errorf("testsvc: redis cluster: %s: %w", master.Addr, err)
	}
	deadline := time.Now().Add(timeout)
	for _, r := range reps {
		for {
			info, err := redisCmd(r.Addr, "INFO", "replication")
			var got int64
			if err == nil {
				got, err = infoInt(info, "slave_repl_offset")
			}
			if err == nil && got >= want {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("testsvc: redis cluster: replica %s of %s not at offset %d after %v: at %d, %v",
					r.Addr, master.Addr, want, timeout, got, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

func (c *Cluster) indexOf(s *Server) (int, error) {
	if s != nil {
		if i, ok := c.index[s.Addr]; ok && c.Nodes[i] == s {
			return i, nil
		}
	}
	return 0, errors.New("testsvc: redis cluster: not a node of this cluster")
}

// observe asks every running node how it sees the cluster and returns
// the layout if the cluster is settled (see WaitOK), or what is not.
func (c *Cluster) observe() (*layout, error) {
	n := len(c.Nodes)
	running := make([]bool, n)
	views := make([]*nodeView, n)
	var first *nodeView
	for i, s := range c.Nodes {
		if running[i] = s.Running(); !running[i] {
			continue
		}
		v, err := c.view(s, running)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", s.Addr, err)
		}
		views[i] = v
		if first == nil {
			first = v
		} else if v.owner != first.owner {
			return nil, fmt.Errorf("node %s sees another slot map than node %s", s.Addr, first.self)
		}
	}
	if first == nil {
		return nil, errors.New("no node is running")
	}
	l := &layout{owner: first.owner, master: make([]int, n)}
	isOwner := make([]bool, n)
	for slot, o := range l.owner {
		switch {
		case o < 0:
			return nil, fmt.Errorf("slot %d is served by no node", slot)
		case !running[o]:
			return nil, fmt.Errorf("slot %d is served by %s, which is down", slot, c.Addrs[o])
		case views[o].master >= 0:
			return nil, fmt.Errorf("slot %d is served by %s, which says it is a replica", slot, c.Addrs[o])
		}
		isOwner[o] = true
	}
	for i, v := range views {
		l.master[i] = -1
		if v == nil || isOwner[i] {
			continue
		}
		switch {
		case v.master < 0:
			return nil, fmt.Errorf("%s is a master without slots", c.Addrs[i])
		case !isOwner[v.master]:
			return nil, fmt.Errorf("%s is the replica of %s, which serves no slot", c.Addrs[i], c.Addrs[v.master])
		case !v.linkUp:
			return nil, fmt.Errorf("%s's link to its master %s is down", c.Addrs[i], c.Addrs[v.master])
		}
		l.master[i] = v.master
	}
	c.mu.Lock()
	c.last = l
	c.mu.Unlock()
	return l, nil
}

// nodeView is how one node sees the cluster.
type nodeView struct {
	self   string
	owner  [numSlots]int16 // index in Nodes of each slot's master, -1 for none
	master int             // the index of its own master if it is a replica, else -1
	linkUp bool            // it is a replica and its link to its master is up
}

// view asks s how it sees the cluster, and fails if s is not ok, does
// not know every node or sees a running node (running[i]) failing.
func (c *Cluster) view(s *Server, running []bool) (*nodeView, error) {
	conn, err := dialRedis(s.Addr)
	if err != nil {
		return nil, err
	}
	defer conn.close()
	info, err := conn.do("CLUSTER", "INFO")
	if err != nil {
		return nil, err
	}
	if !strings.Contains(info, "cluster_state:ok") {
		return nil, errors.New("cluster_state is not ok")
	}
	if known, err := infoInt(info, "cluster_known_nodes"); err != nil || known != int64(len(c.Nodes)) {
		return nil, fmt.Errorf("knows %d nodes of %d (%v)", known, len(c.Nodes), err)
	}
	nodes, err := conn.do("CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	v := &nodeView{self: s.Addr, master: -1}
	for i := range v.owner {
		v.owner[i] = -1
	}
	ids := map[string]int{}
	masterID := ""
	type slotRange struct{ from, to, node int }
	var ranges []slotRange
	for line := range strings.Lines(nodes) {
		// <id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent>
		// <pong-recv> <config-epoch> <link-state> <slot> …
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		flags := "," + f[2] + ","
		if strings.Contains(flags, ",myself,") {
			// A node that no other has met does not know its own IP
			// address: ":port".
			addr = s.Addr
		}
		i, ok := c.index[addr]
		if !ok {
			return nil, fmt.Errorf("knows a node %s (%s) that is not ours", addr, f[2])
		}
		ids[f[0]] = i
		for _, bad := range []string{",handshake,", ",noaddr,", ",fail,", ",fail?,"} {
			if strings.Contains(flags, bad) && running[i] {
				return nil, fmt.Errorf("sees %s as %s", addr, f[2])
			}
		}
		if strings.Contains(flags, ",myself,") && strings.Contains(flags, ",slave,") {
			masterID = f[3]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being migrated or imported
			}
			a, b, isRange := strings.Cut(r, "-")
			if !isRange {
				b = a
			}
			from, err1 := strconv.Atoi(a)
			to, err2 := strconv.Atoi(b)
			if err := errors.Join(err1, err2); err != nil || from < 0 || to >= numSlots || from > to {
				return nil, fmt.Errorf("CLUSTER NODES: slots %q of %s", r, addr)
			}
			ranges = append(ranges, slotRange{from, to, i})
		}
	}
	for _, r := range ranges {
		for slot := r.from; slot <= r.to; slot++ {
			v.owner[slot] = int16(r.node)
		}
	}
	if masterID != "" {
		m, ok := ids[masterID]
		if !ok {
			return nil, fmt.Errorf("replicates %s, which it does not know", masterID)
		}
		v.master = m
		repl, err := conn.do("INFO", "replication")
		if err != nil {
			return nil, err
		}
		v.linkUp = strings.Contains(repl, "master_link_status:up")
	}
	return v, nil
}

// infoInt returns the integer field name of an INFO reply.
func infoInt(info, name string) (int64, error) {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in INFO", name)
}

// Close closes every node. It is idempotent.
func (c *Cluster) Close() error {
	var errs []error
	for _, s := range c.Nodes {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// KeySlot returns the Redis Cluster hash slot of key: CRC16 (XMODEM) of
// its hash tag — what is between its first '{' and the next '}', if that
// is not empty — or else of the whole key, modulo 16384.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % numSlots
}

// redisConn is a connection for a few commands in RESP.
type redisConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialRedis(addr string) (*redisConn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	return &redisConn{c: c, r: bufio.NewReader(c)}, nil
}

func (rc *redisConn) close() { rc.c.Close() }

// redisCmd sends one command in RESP on a connection of its own and
// returns its reply, as redisConn.do.
func redisCmd(addr string, args ...string) (string, error) {
	conn, err := dialRedis(addr)
	if err != nil {
		return "", err
	}
	defer conn.close()
	return conn.do(args...)
}

// do sends one command and returns its reply: the text of a simple
// string, bulk string or integer; an error reply is an error.
func (rc *redisConn) do(args ...string) (string, error) {
	rc.c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := rc.c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := rc.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("%s: %s", strings.Join(args[:min(len(args), 2)], " "), line[1:])
	case '$':
		size, err := strconv.Atoi(line[1:])
		if err != nil || size < 0 {
			return "", err
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(rc.r, buf); err != nil {
			return "", err
		}
		return string(buf[:size]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

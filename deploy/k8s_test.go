package deploy

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/presenced/presenced/internal/connbudget"
	"github.com/presenced/presenced/internal/testsvc"
)

// The parts of the Kubernetes objects the test reads.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`       // ConfigMap
	StringData map[string]string `yaml:"stringData"` // Secret
	Spec       struct {
		// Deployment
		Replicas int `yaml:"replicas"`
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
		// PodDisruptionBudget (selector above)
		MaxUnavailable *int `yaml:"maxUnavailable"`
		MinAvailable   *int `yaml:"minAvailable"`
		// Service: its selector is a plain map, read apart.
		Ports []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
	raw map[string]any
}

type podSpec struct {
	TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot bool `yaml:"runAsNonRoot"`
		RunAsUser    int  `yaml:"runAsUser"`
		RunAsGroup   int  `yaml:"runAsGroup"`
		FSGroup      int  `yaml:"fsGroup"`
	} `yaml:"securityContext"`
	Containers []container `yaml:"containers"`
	Volumes    []struct {
		Name     string         `yaml:"name"`
		EmptyDir map[string]any `yaml:"emptyDir"`
	} `yaml:"volumes"`
}

type container struct {
	Name string   `yaml:"name"`
	Args []string `yaml:"args"`
	Env  []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			ConfigMapKeyRef *keyRef `yaml:"configMapKeyRef"`
			SecretKeyRef    *keyRef `yaml:"secretKeyRef"`
			FieldRef        *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	StartupProbe   *probe `yaml:"startupProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	Lifecycle      struct {
		PreStop struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type keyRef struct {
	Name string `yaml:"name"`
	Key  string `yaml:"key"`
}

type probe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

func only(t *testing.T, objs map[string][]*k8sObject, kind string) *k8sObject {
	t.Helper()
	if len(objs[kind]) != 1 {
		t.Fatalf("%d %s objects rendered, want 1", len(objs[kind]), kind)
	}
	return objs[kind][0]
}

// selects says every label of sel is on labels.
func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// quantity parses a Kubernetes memory quantity (Ki, Mi, Gi or bytes) and
// GOMEMLIMIT's (KiB, MiB, GiB) into bytes.
func quantity(t *testing.T, s string) int64 {
	t.Helper()
	m := regexp.MustCompile(`^([0-9]+)(Ki|Mi|Gi|KiB|MiB|GiB)?$`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("memory quantity %q: want a whole number of Ki, Mi or Gi", s)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	switch strings.TrimSuffix(m[2], "B") {
	case "Ki":
		n <<= 10
	case "Mi":
		n <<= 20
	case "Gi":
		n <<= 30
	}
	return n
}

// Measured memory per idle WebSocket (docs/benchmarks.md): the process's
// RSS at most, and the kernel's socket memory the pod's cgroup is charged.
const (
	rssPerConn    = 3.8 * 1024
	kernelPerConn = 5.0 * 1024
)

// TestKubernetes renders each overlay of kustomize/ and checks its objects
// against each other, the Dockerfile's image and the binary, then runs
// the Deployment's container as Kubernetes would — the image's root (the
// binary alone), the pod's user, its volumes the only writable places,
// its arguments and its environment resolved from the Secret — in the
// embedded mode alone, in the scale-out mode against real Redis,
// PostgreSQL and NATS; it requests its probes on the ports they name and
// scrapes /metrics as the ServiceMonitor does.
func TestKubernetes(t *testing.T) {
	for _, name := range overlays(t) {
		t.Run(name, func(t *testing.T) { testOverlayPod(t, name) })
	}
}

func testOverlayPod(t *testing.T, overlay string) {
	img := dockerBuild(t)
	objs := renderOverlay(t, overlay, "")
	dep := only(t, objs, "Deployment")
	sec := only(t, objs, "Secret")
	sm := only(t, objs, "ServiceMonitor")
	pod := dep.Spec.Template.Spec
	labels := dep.Spec.Template.Metadata.Labels
	if !selects(dep.Spec.Selector.MatchLabels, labels) {
		t.Errorf("the Deployment's selector %v does not select its pods %v", dep.Spec.Selector.MatchLabels, labels)
	}
	checkServices(t, objs, dep)
	// Several replicas: one at a time may go (a disruption budget), and
	// an update rolls; one: no budget (it would forbid every drain), and
	// an update replaces the pod (its volume has one writer).
	strategy := str(dep.raw, "spec", "strategy", "type")
	if dep.Spec.Replicas > 1 {
		pdb := only(t, objs, "PodDisruptionBudget")
		if !selects(pdb.Spec.Selector.MatchLabels, labels) {
			t.Errorf("the PodDisruptionBudget's selector %v does not select the pods %v", pdb.Spec.Selector.MatchLabels, labels)
		}
		if pdb.Spec.MaxUnavailable == nil || *pdb.Spec.MaxUnavailable < 1 || *pdb.Spec.MaxUnavailable >= dep.Spec.Replicas {
			t.Errorf("PodDisruptionBudget maxUnavailable %v with %d replicas: want at least 1 and fewer than the replicas", pdb.Spec.MaxUnavailable, dep.Spec.Replicas)
		}
		if strategy != "RollingUpdate" || fmt.Sprint(field(dep.raw, "spec", "strategy", "rollingUpdate", "maxUnavailable")) != "0" {
			t.Errorf("strategy %s %v: want a rolling update that keeps every replica up", strategy, field(dep.raw, "spec", "strategy", "rollingUpdate"))
		}
	} else if len(objs["PodDisruptionBudget"]) != 0 || strategy != "Recreate" {
		t.Errorf("one replica: %d PodDisruptionBudgets and strategy %s, want none and Recreate", len(objs["PodDisruptionBudget"]), strategy)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]

	// Ports: -addr and -health-addr are the container's ports; the probes
	// and the Service use them by name.
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	portOf := func(flag string) int {
		_, p, err := net.SplitHostPort(flagValue(c.Args, flag))
		n, err2 := strconv.Atoi(p)
		if err != nil || err2 != nil {
			t.Fatalf("args: -%s=%q: want host:port", flag, flagValue(c.Args, flag))
		}
		return n
	}
	if ports["http"] != portOf("addr") || ports["health"] != portOf("health-addr") {
		t.Errorf("container ports %v: want http = -addr's port %d, health = -health-addr's %d", ports, portOf("addr"), portOf("health-addr"))
	}
	probes := map[string]*probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe}
	wantPath := map[string]string{"startup": "/healthz", "readiness": "/readyz", "liveness": "/healthz"}
	for name, p := range probes {
		if p == nil {
			t.Fatalf("no %s probe", name)
		}
		if p.HTTPGet.Path != wantPath[name] || p.HTTPGet.Port != "health" {
			t.Errorf("%s probe %s on %s, want %s on the health port", name, p.HTTPGet.Path, p.HTTPGet.Port, wantPath[name])
		}
	}

	// Shutdown: the preStop sleep, then the node's own drain (at most 10 s
	// for requests in flight, then sockets, tracker, last checkpoint)
	// within the grace period.
	sleep := c.Lifecycle.PreStop.Sleep
	if sleep == nil || sleep.Seconds < 1 {
		t.Fatalf("no preStop sleep")
	}
	if pod.TerminationGracePeriodSeconds < sleep.Seconds+15 {
		t.Errorf("terminationGracePeriodSeconds %d: want at least the preStop sleep %d + 10 s of HTTP drain + 5 s to close", pod.TerminationGracePeriodSeconds, sleep.Seconds)
	}

	// Security: the image's user, nothing writable but the volumes.
	uid, gid := parseUser(t, img.df.final().one(t, "USER").args)
	sc := pod.SecurityContext
	if !sc.RunAsNonRoot || sc.RunAsUser != uid || sc.RunAsGroup != gid {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and the image's USER %d:%d", sc, uid, gid)
	}
	csc := c.SecurityContext
	if !csc.ReadOnlyRootFilesystem || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation || strings.Join(csc.Capabilities.Drop, ",") != "ALL" {
		t.Errorf("container securityContext %+v: want a read-only root, no privilege escalation, all capabilities dropped", csc)
	}
	// Volumes: an emptyDir, or a claim of the render (the embedded
	// node's SQLite file); both writable by fsGroup, as laid out below.
	writable := map[string]bool{}
	for i, v := range pod.Volumes {
		claim := str(dep.raw, "spec", "template", "spec", "volumes", strconv.Itoa(i), "persistentVolumeClaim", "claimName")
		writable[v.Name] = v.EmptyDir != nil || claim != "" && byName(objs, "PersistentVolumeClaim", claim) != nil
	}
	mounts := map[string]bool{}
	for _, m := range c.VolumeMounts {
		if !writable[m.Name] {
			t.Errorf("volume mount %s: want an emptyDir or a claim of the render", m.Name)
		}
		mounts[m.MountPath] = true
	}
	if !mounts[flagValue(c.Args, "data")] {
		t.Errorf("-data=%s is not a mounted volume (the root is read-only)", flagValue(c.Args, "data"))
	}

	// Resources from the measured memory per connection.
	maxConns, err := strconv.Atoi(flagValue(c.Args, "max-conns"))
	if err != nil || maxConns < 1 {
		t.Fatalf("args: -max-conns=%q: the memory is sized for a number of connections", flagValue(c.Args, "max-conns"))
	}
	req, lim := quantity(t, c.Resources.Requests["memory"]), quantity(t, c.Resources.Limits["memory"])
	need := int64(float64(maxConns) * (rssPerConn + kernelPerConn))
	if req < need || lim < req {
		t.Errorf("memory request %s, limit %s: want the request at least -max-conns %d × (%.1f + %.1f) KiB = %d MiB, the limit above it",
			c.Resources.Requests["memory"], c.Resources.Limits["memory"], maxConns, rssPerConn/1024, kernelPerConn/1024, need>>20)
	}

	// The environment, resolved as the kubelet would; the backends' URLs
	// (all three, or none: the embedded mode) replaced by real servers of
	// the same kinds.
	backends := map[string]string{}
	scaleOut := false
	for _, e := range c.Env {
		switch e.Name {
		case "PRESENCE_REDIS_URL", "PRESENCE_POSTGRES_URL", "PRESENCE_NATS_URL":
			scaleOut = true
		}
	}
	if scaleOut {
		redis, pg, nats := testsvc.SharedRedis(t), testsvc.SharedPostgres(t), testsvc.SharedNATS(t)
		backends = map[string]string{"PRESENCE_REDIS_URL": redis.URL, "PRESENCE_POSTGRES_URL": pg.NewDatabase(t), "PRESENCE_NATS_URL": nats.URL}
	}
	_, envFlag := binaryFlags(t, img.binary)
	var env, fromSecret []string
	values := map[string]string{}
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom == nil:
		case e.ValueFrom.ConfigMapKeyRef != nil:
			r := e.ValueFrom.ConfigMapKeyRef
			cm := byName(objs, "ConfigMap", r.Name)
			var ok bool
			if cm != nil {
				v, ok = cm.Data[r.Key]
			}
			if !ok {
				t.Errorf("env %s: no ConfigMap %s with a key %s", e.Name, r.Name, r.Key)
			}
		case e.ValueFrom.SecretKeyRef != nil:
			r := e.ValueFrom.SecretKeyRef
			var ok bool
			if v, ok = sec.StringData[r.Key]; r.Name != sec.Metadata.Name || !ok {
				t.Errorf("env %s: Secret %s has no key %s", e.Name, r.Name, r.Key)
			}
			if _, ok := backends[e.Name]; !ok {
				fromSecret = append(fromSecret, e.Name)
			}
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			v = "presenced-6d4cf56db6-x7k2p"
		default:
			t.Errorf("env %s: unknown valueFrom", e.Name)
		}
		if _, ok := envFlag(e.Name); !ok && !runtimeEnv[e.Name] {
			t.Errorf("env %s: neither a flag's variable of the binary nor one the Go runtime reads", e.Name)
		}
		if real, ok := backends[e.Name]; ok {
			mu, err1 := url.Parse(v)
			ru, err2 := url.Parse(real)
			if err1 != nil || err2 != nil || mu.Scheme != ru.Scheme {
				t.Errorf("env %s=%q: want a %s:// URL", e.Name, v, ru.Scheme)
			}
			v = real
		}
		values[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	for name := range backends {
		if values[name] == "" {
			t.Errorf("no %s: the scale-out mode needs Redis, PostgreSQL and NATS", name)
		}
	}
	if lim := values["GOMEMLIMIT"]; lim == "" || quantity(t, lim)+int64(float64(maxConns)*kernelPerConn) > quantity(t, c.Resources.Limits["memory"]) {
		t.Errorf("GOMEMLIMIT=%q: want it set, and with the kernel's socket memory under the memory limit", lim)
	}

	// The container: the image's root (binary alone), the pod's user, the
	// volumes, the image's ENTRYPOINT with the Deployment's args (which
	// replace the image's CMD), on free ports.
	requireRoot(t)
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	entry := execForm(t, img.df.final().one(t, "ENTRYPOINT"))
	copyFile(t, img.binary, filepath.Join(root, entry[0]), 0o755)
	for m := range mounts {
		d := filepath.Join(root, m)
		if err := os.MkdirAll(d, 0o775); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, 0, sc.FSGroup); err != nil { // an emptyDir with fsGroup: group-owned, setgid
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o2775); err != nil {
			t.Fatal(err)
		}
	}
	argv := append(append(append([]string{}, entry...), c.Args...), "-addr=127.0.0.1:0", "-health-addr=127.0.0.1:0")
	// Started with the example Secret's placeholders, the node refuses to
	// start and says why; the run goes on with generated secrets.
	if len(fromSecret) == 0 {
		t.Fatal("no credential comes from the Secret")
	}
	refused := chrooted(root, sc.RunAsUser, sc.RunAsGroup, argv)
	refused.SysProcAttr.Credential.Groups = []uint32{uint32(sc.FSGroup)}
	refused.Env = env
	var said bytes.Buffer
	refused.Stdout, refused.Stderr = &said, &said
	if err := refused.Start(); err != nil {
		t.Fatal(err)
	}
	stop := time.AfterFunc(30*time.Second, func() { _ = refused.Process.Kill() })
	err = refused.Wait()
	stop.Stop()
	if err == nil || !strings.Contains(said.String(), "placeholder") {
		t.Errorf("a node given the example Secret's placeholders: %v, want it to refuse them:\n%s", err, said.String())
	}
	for i, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if slices.Contains(fromSecret, name) {
			secret := make([]byte, 32)
			_, _ = rand.Read(secret)
			values[name] = hex.EncodeToString(secret)
			env[i] = name + "=" + values[name]
		}
	}
	cmd := chrooted(root, sc.RunAsUser, sc.RunAsGroup, argv)
	cmd.SysProcAttr.Credential.Groups = []uint32{uint32(sc.FSGroup)}
	cmd.Env = env
	n := startNode(t, cmd, true)
	mode, ready := "embedded", []string{`"sqlite":"ok"`}
	if scaleOut {
		mode, ready = "redis+postgres+nats", []string{`"redis":"ok"`, `"postgres":"ok"`, `"nats":"ok"`}
	}
	if !strings.Contains(n.logs.String(), `"mode":"`+mode) {
		t.Errorf("the node does not log the mode %s:\n%s", mode, n.logs)
	}
	// One client address may hold its share of -max-conns, not all of it.
	want := connbudget.ForMax(maxConns)
	if v := flagValue(c.Args, "max-conns-per-ip"); v != "" {
		want.PerAddr, _ = strconv.Atoi(v)
	}
	if budget := fmt.Sprintf(`"msg":"connection budget","max":%d,"per_address":%d,`, want.Max, want.PerAddr); !strings.Contains(n.logs.String(), budget) {
		t.Errorf("no %s in the logs:\n%s", budget, n.logs)
	}
	health := n.health
	waitReady(t, n, health)
	for name, p := range probes {
		code, body := get(t, health, p.HTTPGet.Path, "")
		if code != http.StatusOK {
			t.Errorf("%s probe %s: %d %s", name, p.HTTPGet.Path, code, body)
		}
	}
	// The environment was read: the node runs on the three backends, or
	// on its SQLite file in the volume.
	_, body := get(t, health, "/readyz", "")
	for _, w := range ready {
		if !strings.Contains(body, w) {
			t.Errorf("/readyz %s: want %s", body, w)
		}
	}
	apiKey := values["PRESENCE_API_KEY"]
	if code, body := do(t, "POST", n.addr, "/v1/heartbeat", apiKey, `{"user_id":"alice","device_id":"d1"}`); code != http.StatusOK {
		t.Fatalf("heartbeat with the API key: %d %s", code, body)
	}
	if code, body := get(t, n.addr, "/v1/presence/alice", apiKey); code != http.StatusOK || !strings.Contains(body, `"online"`) {
		t.Errorf("alice: %d %s, want online", code, body)
	}
	// Prometheus: /metrics on the health port, with the credentials the
	// ServiceMonitor names (the Secret's key, generated here as for the
	// node); refused without.
	path := str(sm.raw, "spec", "endpoints", "0", "path")
	key := str(sm.raw, "spec", "endpoints", "0", "authorization", "credentials", "key")
	bearer := ""
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Key == key {
			bearer = values[e.Name]
		}
	}
	if code, _ := get(t, health, path, ""); code != http.StatusUnauthorized {
		t.Errorf("%s without credentials: %d, want 401", path, code)
	}
	code, body := get(t, health, path, bearer)
	if code != http.StatusOK || !scrapedNames(body)["presenced_build_info"] {
		t.Errorf("%s with the ServiceMonitor's bearer token (Secret key %s): %d, want 200 and presenced_build_info:\n%s", path, key, code, body)
	}
	n.stop(t)
	// Nothing written outside the volumes (the root is the pod's read-only
	// root file system).
	entries, _ := os.ReadDir(root)
	if len(entries) != 1+len(mounts) {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("the root holds %q: want only the binary and the mounts", names)
	}
}

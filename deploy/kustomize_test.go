package deploy

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// kustomizeBin finds kustomize on PATH: the release scripts/test.sh
// builds from the Go module proxy into its cache directory and puts first
// on PATH (KUSTOMIZE_VERSION there). Missing, or another release, the
// tests that render the overlays fail under CI=true and are skipped
// (missing) or warned about elsewhere.
func kustomizeBin(t *testing.T) string {
	t.Helper()
	script, err := os.ReadFile(filepath.Join(repoRoot, "scripts", "test.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^KUSTOMIZE_VERSION=(v[0-9.]+)$`).FindSubmatch(script)
	if m == nil {
		t.Fatal("scripts/test.sh sets no KUSTOMIZE_VERSION")
	}
	want := string(m[1])
	ci := os.Getenv("CI") == "true"
	bin, err := exec.LookPath("kustomize")
	if err != nil {
		msg := "kustomize is not on PATH: scripts/test.sh builds sigs.k8s.io/kustomize/kustomize/v5@" + want + " into its cache directory"
		if ci {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	out, _ := exec.Command(bin, "version").Output()
	if got := strings.TrimSpace(string(out)); got != want {
		if ci {
			t.Fatalf("%s is kustomize %q, want %s (scripts/test.sh)", bin, got, want)
		}
		t.Logf("%s is kustomize %q, not %s (scripts/test.sh): the render may differ", bin, got, want)
	}
	return bin
}

// overlays lists the overlays of kustomize/overlays.
func overlays(t *testing.T) []string {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join("kustomize", "overlays", "*", "kustomization.yaml"))
	var names []string
	for _, d := range dirs {
		names = append(names, filepath.Base(filepath.Dir(d)))
	}
	if len(names) < 2 {
		t.Fatalf("overlays %q: want at least embedded and scale-out", names)
	}
	return names
}

// renderOverlay renders kustomize/overlays/<name> with kustomize, as an
// operator would after copying its secrets.env.example to secrets.env
// (so the Secret holds the example's placeholders), and decodes every
// document by kind. The Secret's data is decoded into StringData. The
// tree is copied first: the test writes no secrets.env beside the files.
// prefix, if not empty, is set as the overlay's namePrefix.
func renderOverlay(t *testing.T, name, prefix string) map[string][]*k8sObject {
	t.Helper()
	bin := kustomizeBin(t)
	tree := t.TempDir()
	err := filepath.WalkDir("kustomize", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(tree, path)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if d.Name() == "secrets.env" { // an operator's real one
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tree, "kustomize", "overlays", name)
	if b, err := os.ReadFile(filepath.Join(dir, "secrets.env.example")); err != nil {
		t.Fatalf("overlay %s: %v", name, err)
	} else if err := os.WriteFile(filepath.Join(dir, "secrets.env"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if prefix != "" {
		k := filepath.Join(dir, "kustomization.yaml")
		b, err := os.ReadFile(k)
		if err != nil {
			t.Fatal(err)
		}
		set := regexp.MustCompile(`(?m)^namePrefix: .*$`)
		if !set.Match(b) {
			t.Fatalf("overlays/%s/kustomization.yaml sets no namePrefix: the names are set there", name)
		}
		if err := os.WriteFile(k, set.ReplaceAll(b, []byte("namePrefix: "+prefix)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "build", dir)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build overlays/%s: %v\n%s", name, err, stderr.String())
	}
	objs := decodeObjects(t, "overlays/"+name, out)
	for _, s := range objs["Secret"] {
		if s.StringData == nil {
			s.StringData = map[string]string{}
		}
		for k, v := range s.Data {
			b, err := base64.StdEncoding.DecodeString(v)
			if err != nil {
				t.Fatalf("Secret %s: data %s: %v", s.Metadata.Name, k, err)
			}
			s.StringData[k] = string(b)
		}
	}
	return objs
}

// decodeObjects decodes a stream of YAML documents by kind.
func decodeObjects(t *testing.T, where string, b []byte) map[string][]*k8sObject {
	t.Helper()
	out := map[string][]*k8sObject{}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var node yaml.Node
		if err := dec.Decode(&node); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		o := &k8sObject{}
		if err := node.Decode(o); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if err := node.Decode(&o.raw); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if o.Kind == "" || o.APIVersion == "" || o.Metadata.Name == "" {
			t.Fatalf("%s: a document without kind, apiVersion or name", where)
		}
		out[o.Kind] = append(out[o.Kind], o)
	}
	return out
}

// field walks raw (maps by key, lists by index) and returns what is there
// or nil.
func field(raw any, path ...string) any {
	for _, p := range path {
		switch v := raw.(type) {
		case map[string]any:
			raw = v[p]
		case []any:
			i, err := strconv.Atoi(p)
			if err != nil || i < 0 || i >= len(v) {
				return nil
			}
			raw = v[i]
		default:
			return nil
		}
	}
	return raw
}

func str(raw any, path ...string) string {
	s, _ := field(raw, path...).(string)
	return s
}

func stringMap(raw any) map[string]string {
	m := map[string]string{}
	if in, ok := raw.(map[string]any); ok {
		for k, v := range in {
			m[k] = str(v)
		}
	}
	return m
}

// byName returns the object of kind named name, or nil.
func byName(objs map[string][]*k8sObject, kind, name string) *k8sObject {
	for _, o := range objs[kind] {
		if o.Metadata.Name == name {
			return o
		}
	}
	return nil
}

// kubeStateMetrics are the series of kube-state-metrics the alerts may
// name (presenced does not export whether Kubernetes finds its pods
// ready); `up` is Prometheus' own. Every other series an alert names is
// declared in internal/metrics.
var kubeStateMetrics = map[string]bool{"kube_deployment_status_replicas_unavailable": true}

// TestKustomizeOverlays renders every overlay and checks what it renders
// against itself and the binary: one namespace and the overlay's image
// on everything, every reference (Secret keys, volume claims, Services
// of the Ingress and the ServiceMonitor) to an object of the render,
// selectors that select the pods, the topology spread, every flag and
// variable one the binary has, every metric an alert names one presenced
// declares. Each overlay is rendered as it is and with a namePrefix, which
// every name and every reference must follow. TestKubernetes runs the
// overlays' pods.
func TestKustomizeOverlays(t *testing.T) {
	img := dockerBuild(t)
	flags, envFlag := binaryFlags(t, img.binary)
	declared := declaredMetrics(t)
	// An operator's secrets.env holds the real credentials: git must
	// never take it.
	if b, err := os.ReadFile(filepath.Join("kustomize", ".gitignore")); err != nil || !slices.Contains(strings.Split(string(b), "\n"), "secrets.env") {
		t.Errorf("kustomize/.gitignore does not ignore secrets.env (%v)", err)
	}
	var runs []struct{ overlay, prefix string }
	for _, name := range overlays(t) {
		runs = append(runs, struct{ overlay, prefix string }{name, ""}, struct{ overlay, prefix string }{name, "acme-"})
	}
	for _, run := range runs {
		name := run.overlay
		if run.prefix != "" {
			name += "/prefix=" + run.prefix
		}
		t.Run(name, func(t *testing.T) {
			objs := renderOverlay(t, run.overlay, run.prefix)
			for kind, list := range objs {
				for _, o := range list {
					if !strings.HasPrefix(o.Metadata.Name, run.prefix+"presenced") {
						t.Errorf("%s %s: want the name to start with %spresenced", kind, o.Metadata.Name, run.prefix)
					}
				}
			}
			var ns string
			for kind, list := range objs {
				for _, o := range list {
					got := str(o.raw, "metadata", "namespace")
					if ns == "" {
						ns = got
					}
					if got == "" || got != ns {
						t.Errorf("%s %s: namespace %q, want the overlay's one namespace (%q)", kind, o.Metadata.Name, got, ns)
					}
				}
			}
			dep := only(t, objs, "Deployment")
			sec := only(t, objs, "Secret")
			pod := dep.Spec.Template.Spec
			labels := dep.Spec.Template.Metadata.Labels
			c := pod.Containers[0]
			image := str(dep.raw, "spec", "template", "spec", "containers", "0", "image")
			if !strings.Contains(image, "/") || !strings.Contains(image, ":") {
				t.Errorf("image %q: want the overlay's registry and tag (images:)", image)
			}
			for _, a := range c.Args {
				f, _, _ := strings.Cut(strings.TrimPrefix(a, "-"), "=")
				if !strings.HasPrefix(a, "-") || !flags[f] {
					t.Errorf("arg %q: the binary has no such flag", a)
				}
			}
			for _, e := range c.Env {
				if _, ok := envFlag(e.Name); !ok && !runtimeEnv[e.Name] {
					t.Errorf("env %s: neither a flag's variable of the binary nor one the Go runtime reads", e.Name)
				}
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					r := e.ValueFrom.SecretKeyRef
					if _, ok := sec.StringData[r.Key]; r.Name != sec.Metadata.Name || !ok {
						t.Errorf("env %s: Secret %s key %s: the render's Secret is %s with keys %v", e.Name, r.Name, r.Key, sec.Metadata.Name, keys(sec.StringData))
					}
				}
			}
			for k := range sec.StringData {
				used := false
				for _, e := range c.Env {
					used = used || e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Key == k
				}
				if !used {
					t.Errorf("Secret key %s: no variable reads it", k)
				}
			}
			// Volumes: an emptyDir, or a claim of the render.
			for i := range pod.Volumes {
				claim := str(dep.raw, "spec", "template", "spec", "volumes", strconv.Itoa(i), "persistentVolumeClaim", "claimName")
				if claim != "" && byName(objs, "PersistentVolumeClaim", claim) == nil {
					t.Errorf("volume %s: claim %s is not in the render", pod.Volumes[i].Name, claim)
				}
				if claim == "" && pod.Volumes[i].EmptyDir == nil {
					t.Errorf("volume %s: neither an emptyDir nor a claim", pod.Volumes[i].Name)
				}
			}
			for _, pdb := range objs["PodDisruptionBudget"] {
				if !selects(pdb.Spec.Selector.MatchLabels, labels) {
					t.Errorf("PodDisruptionBudget %s does not select the pods", pdb.Metadata.Name)
				}
				if pdb.Spec.MaxUnavailable == nil || *pdb.Spec.MaxUnavailable >= dep.Spec.Replicas {
					t.Errorf("PodDisruptionBudget maxUnavailable %v with %d replicas: want fewer than the replicas", pdb.Spec.MaxUnavailable, dep.Spec.Replicas)
				}
			}
			checkSpread(t, dep)
			checkServices(t, objs, dep)
			checkMonitoring(t, objs, dep, func(metric string) bool {
				return declared[metric] || metric == "up" || kubeStateMetrics[metric]
			})
			checkIngress(t, objs)
		})
	}
}

func keys(m map[string]string) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// checkSpread: at most one pod more on a machine than on another, as a
// rule; across zones, as a preference; both counting the pods of the
// Deployment.
func checkSpread(t *testing.T, dep *k8sObject) {
	t.Helper()
	list, _ := field(dep.raw, "spec", "template", "spec", "topologySpreadConstraints").([]any)
	want := map[string]string{"kubernetes.io/hostname": "DoNotSchedule", "topology.kubernetes.io/zone": "ScheduleAnyway"}
	got := map[string]string{}
	for _, c := range list {
		key := str(c, "topologyKey")
		got[key] = str(c, "whenUnsatisfiable")
		if sel := stringMap(field(c, "labelSelector", "matchLabels")); !selects(sel, dep.Spec.Template.Metadata.Labels) {
			t.Errorf("topology spread on %s: labelSelector %v does not select the pods", key, sel)
		}
		if n, _ := field(c, "maxSkew").(int); n != 1 {
			t.Errorf("topology spread on %s: maxSkew %v, want 1", key, field(c, "maxSkew"))
		}
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("topology spread on %s: %q, want %s", k, got[k], w)
		}
	}
}

// checkServices: one Service for clients (the -addr port only) and one
// for the health port (the -health-addr port only), both selecting the
// pods.
func checkServices(t *testing.T, objs map[string][]*k8sObject, dep *k8sObject) {
	t.Helper()
	ports := map[string]bool{}
	for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = true
	}
	targets := map[string]bool{}
	for _, s := range objs["Service"] {
		if sel := stringMap(field(s.raw, "spec", "selector")); !selects(sel, dep.Spec.Template.Metadata.Labels) {
			t.Errorf("Service %s: selector %v does not select the pods", s.Metadata.Name, sel)
		}
		if len(s.Spec.Ports) != 1 {
			t.Errorf("Service %s: %d ports, want 1: clients and the health port have a Service each", s.Metadata.Name, len(s.Spec.Ports))
		}
		for _, p := range s.Spec.Ports {
			if !ports[p.TargetPort] {
				t.Errorf("Service %s: targetPort %q is no container port", s.Metadata.Name, p.TargetPort)
			}
			targets[p.TargetPort] = true
		}
	}
	if len(objs["Service"]) != 2 || !targets["http"] || !targets["health"] {
		t.Errorf("%d Services for ports %v: want one for http, one for health", len(objs["Service"]), targets)
	}
}

// healthService returns the Service whose port is the health port.
func healthService(t *testing.T, objs map[string][]*k8sObject) *k8sObject {
	t.Helper()
	for _, s := range objs["Service"] {
		if len(s.Spec.Ports) == 1 && s.Spec.Ports[0].TargetPort == "health" {
			return s
		}
	}
	t.Fatal("no Service of the health port")
	return nil
}

// checkMonitoring: the ServiceMonitor scrapes /metrics on the health
// Service's port with the Secret's key the nodes take their API key from,
// and names its job as the alerts select it; every alert's expression
// selects series that exist.
func checkMonitoring(t *testing.T, objs map[string][]*k8sObject, dep *k8sObject, exists func(string) bool) {
	t.Helper()
	sm := only(t, objs, "ServiceMonitor")
	rule := only(t, objs, "PrometheusRule")
	for _, o := range []*k8sObject{sm, rule} {
		if o.APIVersion != "monitoring.coreos.com/v1" {
			t.Errorf("%s: apiVersion %s, want monitoring.coreos.com/v1", o.Kind, o.APIVersion)
		}
	}
	health := healthService(t, objs)
	if sel := stringMap(field(sm.raw, "spec", "selector", "matchLabels")); !selects(sel, health.Metadata.Labels) {
		t.Errorf("ServiceMonitor: selector %v does not select the Service %s (%v)", sel, health.Metadata.Name, health.Metadata.Labels)
	}
	for _, s := range objs["Service"] {
		if s != health && selects(stringMap(field(sm.raw, "spec", "selector", "matchLabels")), s.Metadata.Labels) {
			t.Errorf("ServiceMonitor: selects the clients' Service %s too", s.Metadata.Name)
		}
	}
	job := health.Metadata.Labels[str(sm.raw, "spec", "jobLabel")]
	if job == "" {
		t.Errorf("ServiceMonitor: jobLabel %q is no label of the Service %s", str(sm.raw, "spec", "jobLabel"), health.Metadata.Name)
	}
	eps, _ := field(sm.raw, "spec", "endpoints").([]any)
	if len(eps) != 1 {
		t.Fatalf("ServiceMonitor: %d endpoints, want 1", len(eps))
	}
	ep := eps[0]
	if str(ep, "port") != health.Spec.Ports[0].Name || str(ep, "path") != "/metrics" {
		t.Errorf("ServiceMonitor: port %q path %q, want %q /metrics", str(ep, "port"), str(ep, "path"), health.Spec.Ports[0].Name)
	}
	apiKeyRef := ""
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "PRESENCE_API_KEY" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			apiKeyRef = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		}
	}
	cred := str(ep, "authorization", "credentials", "name") + "/" + str(ep, "authorization", "credentials", "key")
	if str(ep, "authorization", "type") != "Bearer" || apiKeyRef == "" || cred != apiKeyRef {
		t.Errorf("ServiceMonitor: bearer credentials %s, want the API key's %s", cred, apiKeyRef)
	}

	// The alerts.
	groups, _ := field(rule.raw, "spec", "groups").([]any)
	alerts := map[string]string{}
	for _, g := range groups {
		rules, _ := field(g, "rules").([]any)
		for _, r := range rules {
			name, expr := str(r, "alert"), str(r, "expr")
			if name == "" || expr == "" {
				t.Errorf("PrometheusRule: a rule without alert or expr: %v", r)
				continue
			}
			alerts[name] = expr
			if f := str(r, "for"); f != "" {
				if _, err := time.ParseDuration(f); err != nil {
					t.Errorf("alert %s: for %q: %v", name, f, err)
				}
			}
			if str(r, "labels", "severity") == "" || str(r, "annotations", "summary") == "" {
				t.Errorf("alert %s: want a severity and a summary", name)
			}
			names := promQLNames(expr)
			if len(names) == 0 {
				t.Errorf("alert %s: %q selects no metric", name, expr)
			}
			for _, m := range names {
				if !exists(m) {
					t.Errorf("alert %s: %q names %s, which neither presenced, Prometheus nor kube-state-metrics exposes", name, expr, m)
				}
				if strings.HasPrefix(m, "presenced_") || m == "up" {
					if !strings.Contains(expr, m+`{job="`+job+`"`) {
						t.Errorf("alert %s: %s without {job=%q}, the ServiceMonitor's job", name, m, job)
					}
				}
			}
		}
	}
	// The faults of docs/operations.md each have an alert.
	all := ""
	for _, e := range alerts {
		all += e + "\n"
	}
	for _, m := range []string{"presenced_store_down", "presenced_bus_unacked_seconds", "presenced_bus_dropped_total",
		"presenced_kafka_ingest_lag", "presenced_kafka_changes_dropped_total", "presenced_webhook_dropped_total",
		"presenced_connections_refused_total", "up", "kube_deployment_status_replicas_unavailable"} {
		if !slices.Contains(promQLNames(all), m) {
			t.Errorf("no alert on %s", m)
		}
	}
}

// checkIngress: an Ingress routes to a Service of the render and its port,
// with proxy timeouts well above the clients' heartbeat interval (15 s
// at the default ttl) and no session affinity.
func checkIngress(t *testing.T, objs map[string][]*k8sObject) {
	t.Helper()
	for _, ing := range objs["Ingress"] {
		ann := stringMap(field(ing.raw, "metadata", "annotations"))
		for _, a := range []string{"nginx.ingress.kubernetes.io/proxy-read-timeout", "nginx.ingress.kubernetes.io/proxy-send-timeout"} {
			if s, err := strconv.Atoi(ann[a]); err != nil || s < 4*15 {
				t.Errorf("Ingress %s: %s %q: want seconds, several heartbeat intervals (15 s)", ing.Metadata.Name, a, ann[a])
			}
		}
		if ann["nginx.ingress.kubernetes.io/affinity"] != "" {
			t.Errorf("Ingress %s: session affinity: any node takes any client", ing.Metadata.Name)
		}
		svc := str(ing.raw, "spec", "rules", "0", "http", "paths", "0", "backend", "service", "name")
		port := str(ing.raw, "spec", "rules", "0", "http", "paths", "0", "backend", "service", "port", "name")
		s := byName(objs, "Service", svc)
		if s == nil || len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Name != port || s.Spec.Ports[0].TargetPort != "http" {
			t.Errorf("Ingress %s: backend %s port %s: want the clients' Service and its port", ing.Metadata.Name, svc, port)
		}
	}
}

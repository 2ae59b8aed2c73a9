// The operator page (/admin): sign in with the API key, then poll
// GET /v1/admin/stats every second and draw up to the last five minutes; ask
// GET /v1/debug/users/{id} why a user shows what it shows, and
// GET /v1/rooms/{id} who is in a room.
//
// The key lives in this tab's sessionStorage only and goes to this origin
// only, as a bearer token. The page holds no secret of its own. Every value
// from the server is written with textContent, never as HTML.

const KEY = "presenced.admin.key";
const POLL_MS = 1000;
const WINDOW_MS = 5 * 60 * 1000;
const $ = (id) => document.getElementById(id);

let apiKey = null;
let timer = null;
let prev = null; // the last stats answer, for rates
const history = {
  conns: [{ name: "connections", pts: [] }, { name: "online users", pts: [] }],
  beats: [{ name: "heartbeats/s", pts: [] }],
  fanout: [{ name: "messages/s", pts: [] }, { name: "frames/s", pts: [] }],
  bus: [{ name: "published/s", pts: [] }, { name: "received/s", pts: [] }],
};

class APIError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(path) {
  const r = await fetch(path, { headers: { Authorization: `Bearer ${apiKey}` }, cache: "no-store" });
  let body = null;
  try {
    body = await r.json();
  } catch {
    // not JSON: reported by status below
  }
  if (!r.ok) {
    throw new APIError(r.status, body?.error?.code ?? "", body?.error?.message ?? `HTTP ${r.status}`);
  }
  return body;
}

// why says in words why a sign-in or a poll was refused.
function why(e) {
  if (e.status === 401) return "That key was refused: it is not this server's API key (401 invalid credentials).";
  if (e.status === 403) return "That is a client token, not the API key: the operator page needs the API key (403).";
  if (e instanceof APIError) return `The server answered ${e.status}: ${e.message}`;
  return `The server could not be reached: ${e.message}`;
}

// --- sign-in ---

async function signIn(key) {
  apiKey = key;
  $("signin-error").textContent = "";
  $("state").textContent = "Signing in…";
  let stats;
  try {
    stats = await api("/v1/admin/stats");
  } catch (e) {
    signOut(why(e));
    return;
  }
  sessionStorage.setItem(KEY, key);
  $("signin").hidden = true;
  $("dash").hidden = false;
  $("signout").hidden = false;
  $("api-key").value = "";
  show(stats);
  schedule();
}

function signOut(message) {
  clearTimeout(timer);
  timer = null;
  apiKey = null;
  prev = null;
  sessionStorage.removeItem(KEY);
  for (const s of Object.values(history)) for (const l of s) l.pts.length = 0;
  $("dash").hidden = true;
  $("signout").hidden = true;
  $("signin").hidden = false;
  $("signin-error").textContent = message ?? "";
  $("state").textContent = "Not signed in";
  $("api-key").focus();
}

$("signin-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const key = $("api-key").value.trim();
  if (!key) {
    $("signin-error").textContent = "Enter the API key.";
    return;
  }
  signIn(key);
});
$("signout").addEventListener("click", () => signOut());

// --- polling ---

function schedule() {
  clearTimeout(timer);
  timer = setTimeout(poll, POLL_MS);
}

async function poll() {
  if (!apiKey) return;
  try {
    show(await api("/v1/admin/stats"));
    $("poll-error").hidden = true;
  } catch (e) {
    if (e.status === 401 || e.status === 403) {
      signOut(why(e) + " Signed out.");
      return;
    }
    $("poll-error").textContent = why(e) + " Retrying.";
    $("poll-error").hidden = false;
  }
  if (apiKey) schedule();
}

// rate is the change of counter name per second between two answers;
// null if either lacks it, or it went down (the node restarted).
function rate(cur, old, name) {
  if (!old || !(name in cur.metrics) || !(name in old.metrics)) return null;
  const dt = (cur.now_ms - old.now_ms) / 1000;
  const dv = cur.metrics[name] - old.metrics[name];
  if (dt <= 0 || dv < 0) return null;
  return dv / dt;
}

function show(s) {
  const m = s.metrics;
  const self = s.nodes.find((n) => n.self);
  $("state").textContent = `Signed in · ${self?.id || "node"} · ${when(s.now_ms)}`;
  showNodes(s.nodes);

  const conns = m.presenced_ws_connections ?? null;
  const online = m.presenced_online_users ?? null; // absent with Redis: no node knows the cluster's
  const beats = rate(s, prev, "presenced_heartbeats_total");
  const delivered = rate(s, prev, "presenced_fanout_delivered_total");
  const frames = rate(s, prev, "presenced_fanout_frames_total");
  const published = rate(s, prev, "presenced_bus_published_total");
  const received = rate(s, prev, "presenced_bus_received_total");
  const hasBus = "presenced_bus_published_total" in m;

  $("v-connections").textContent = fmt(conns);
  $("v-online").textContent = online === null ? "n/a" : fmt(online);
  $("v-online").title = online === null ? "Not known with the state in Redis: each node sees only its share" : "";
  $("v-ws-users").textContent = fmt(m.presenced_ws_users ?? null);
  $("v-beats").textContent = fmt(beats);
  $("v-fanout").textContent = fmt(delivered);
  $("v-bus").textContent = hasBus ? fmt((published ?? 0) + (received ?? 0)) : "no bus";
  const rss = m.process_resident_memory_bytes;
  $("v-memory").textContent = rss === undefined ? "–" : `${(rss / (1 << 20)).toFixed(0)} MiB`;

  const t = s.now_ms;
  push(history.conns[0], t, conns);
  push(history.conns[1], t, online);
  push(history.beats[0], t, beats);
  push(history.fanout[0], t, delivered);
  push(history.fanout[1], t, frames);
  if (hasBus) {
    push(history.bus[0], t, published);
    push(history.bus[1], t, received);
  }
  plot($("plot-conns"), history.conns, t);
  plot($("plot-beats"), history.beats, t);
  plot($("plot-fanout"), history.fanout, t);
  plot($("plot-bus"), history.bus, t, hasBus ? "" : "No bus: this node runs without NATS.");
  prev = s;
}

function push(line, t, v) {
  if (v !== null && v !== undefined) line.pts.push({ t, v });
  while (line.pts.length && line.pts[0].t < t - WINDOW_MS) line.pts.shift();
}

function fmt(v) {
  if (v === null || v === undefined) return "–";
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (v >= 1e4) return `${(v / 1e3).toFixed(1)}k`;
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}

// One time format on the page: the browser's local date and time (the
// exact instant, UTC, is the element's title where one is shown).
function when(t) {
  return new Date(t).toLocaleString();
}

function ago(iso, nowMs) {
  if (!iso) return null;
  const ms = nowMs - Date.parse(iso);
  if (ms < 0) return `in ${(-ms / 1000).toFixed(1)} s`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s ago`;
  if (ms < 3600000) return `${Math.round(ms / 60000)} min ago`;
  return when(iso);
}

// stamp shows a time of the server's (ISO) in the page's format, with how
// long ago or how soon it is, the instant itself in the title.
function stamp(elem, iso, nowMs) {
  elem.textContent = `${when(iso)} (${ago(iso, nowMs)})`;
  elem.title = iso;
}

// --- nodes ---

function showNodes(nodes) {
  const ul = $("nodes");
  ul.replaceChildren(
    ...nodes.map((n) => {
      const li = el("li");
      li.dataset.health = n.health;
      li.dataset.self = String(n.self);
      li.dataset.id = n.id || "";
      const name = (n.id || `lease ${n.lease}`) + (n.self ? " (this node)" : "");
      let detail = n.detail || "";
      if (n.self) {
        const checks = Object.entries(n.checks ?? {}).map(([k, v]) => `${k} ${v}`).join(" · ");
        detail = [n.mode, checks, n.started ? `up since ${when(n.started)}` : "", detail]
          .filter(Boolean).join(" — ");
      } else if (n.lease) {
        detail = `lease ${n.lease} — ${detail}`;
      }
      li.append(el("span", "dot"), el("span", "name", name), el("span", "health", n.health.replace("_", " ")), el("span", "detail", detail));
      return li;
    }),
  );
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// --- plots: hand-drawn SVG, the last WINDOW_MS ---

const SVG = $("plot-conns").namespaceURI; // the SVG namespace, from the page's own <svg>

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
function niceCeil(v) {
  if (!(v > 0)) return 1;
  const e = 10 ** Math.floor(Math.log10(v));
  const f = v / e;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * e;
}

function plot(svg, lines, now, empty = "") {
  const W = Math.max(svg.clientWidth, 200);
  const H = Math.max(svg.clientHeight, 100);
  const L = 40, R = 8, T = 16, B = 18;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const kids = [];
  const most = Math.max(0, ...lines.map((l) => l.pts.length));
  svg.dataset.points = String(most);
  if (empty) {
    kids.push(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "none" }, empty));
    svg.replaceChildren(...kids);
    return;
  }
  // The x axis spans what was sampled, at least a minute, at most the window.
  const oldest = Math.min(now, ...lines.flatMap((l) => (l.pts.length ? [l.pts[0].t] : [])));
  const span = Math.min(WINDOW_MS, Math.max(60000, now - oldest));
  const top = niceCeil(Math.max(0, ...lines.flatMap((l) => l.pts.map((p) => p.v))));
  const x = (t) => L + ((t - (now - span)) / span) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  for (const v of [0, top / 2, top]) {
    kids.push(svgEl("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" }));
    kids.push(svgEl("text", { x: L - 4, y: y(v) + 4, "text-anchor": "end", class: "axis" }, fmt(v)));
  }
  for (const [i, label] of [[0, `−${spanText(span)}`], [0.5, `−${spanText(span / 2)}`], [1, "now"]]) {
    const anchor = i === 0 ? "start" : i === 1 ? "end" : "middle";
    kids.push(svgEl("text", { x: L + i * (W - L - R), y: H - 4, "text-anchor": anchor, class: "axis" }, label));
  }
  let lx = W - R;
  lines.forEach((l, i) => {
    if (l.pts.length) {
      const pts = l.pts.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(" ");
      kids.push(svgEl("polyline", { points: pts, class: `s${i}` }));
    }
    const last = l.pts.at(-1);
    const legend = svgEl("text", { x: lx, y: 11, "text-anchor": "end", class: `l${i}` }, `${l.name} ${last ? fmt(last.v) : "–"}`);
    kids.push(legend);
    lx -= 8 + 7 * legend.textContent.length;
  });
  if (most === 0) kids.push(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "none" }, "waiting for a second sample…"));
  svg.replaceChildren(...kids);
}

function spanText(ms) {
  const secs = Math.round(ms / 1000);
  return secs < 120 ? `${secs} s` : `${(secs / 60).toFixed(secs % 60 ? 1 : 0)} min`;
}

// --- who is in a room ---

$("room-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const id = $("room-id").value.trim();
  const viewer = $("room-viewer-id").value.trim();
  $("room-error").textContent = "";
  let path = `/v1/rooms/${encodeURIComponent(id)}?limit=100`;
  if (viewer) path += `&viewer_id=${encodeURIComponent(viewer)}`;
  try {
    showRoom(await api(path));
  } catch (e) {
    $("room-view").hidden = true;
    $("room-error").textContent = e.status === 401 || e.status === 403 ? why(e) : `${e.message}`;
  }
});

function showRoom(r) {
  $("room-count").textContent = `${r.count} ${r.count === 1 ? "member" : "members"}`;
  $("room-facts").textContent = r.count
    ? `version ${r.version}${r.next ? "; more than the first 100" : ""}`
    : "nobody is in it (an empty room is no room)";
  const members = Object.entries(r.members);
  $("room-members").replaceChildren(
    ...(members.length
      ? members.map(([user, status]) => {
          const tr = el("tr");
          tr.dataset.user = user;
          tr.append(el("td", "", user), el("td", "", status ?? "hidden from this viewer"));
          return tr;
        })
      : [(() => {
          const tr = el("tr");
          const td = el("td", "", "no members");
          td.colSpan = 2;
          tr.append(td);
          return tr;
        })()]),
  );
  $("room-view").hidden = false;
}

// --- why does a user show what it shows ---

$("user-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const id = $("user-id").value.trim();
  const viewer = $("viewer-id").value.trim();
  $("user-error").textContent = "";
  let path = `/v1/debug/users/${encodeURIComponent(id)}`;
  if (viewer) path += `?viewer_id=${encodeURIComponent(viewer)}`;
  try {
    showUser(await api(path));
  } catch (e) {
    $("user-view").hidden = true;
    $("user-error").textContent = e.status === 401 || e.status === 403 ? why(e) : `${e.message}`;
  }
});

function showUser(u) {
  const now = Date.parse(u.now);
  const badge = $("user-status");
  badge.textContent = u.status;
  badge.dataset.status = u.status;
  $("user-reason").textContent = u.reason + (u.public_status !== u.status ? ` (others see ${u.public_status})` : "");
  $("user-manual").textContent = u.manual_status ?? "none (set by activity)";
  $("user-text").textContent = u.status_text || "—";
  if (u.last_seen) stamp($("user-seen"), u.last_seen, now);
  else $("user-seen").textContent = "never";
  if (u.public_last_seen && u.public_last_seen !== u.last_seen) {
    $("user-seen").textContent += `; others see ${when(u.public_last_seen)}`;
  }
  $("user-status-vis").textContent = u.settings.status_visibility;
  $("user-seen-vis").textContent = u.settings.last_seen_visibility;
  if (u.next_deadline) stamp($("user-deadline"), u.next_deadline, now);
  else $("user-deadline").textContent = "none";
  $("user-where").textContent = u.in_memory
    ? "in the hot state"
    : u.known
      ? "not in the hot state: read from its durable record"
      : "unknown: never seen";
  $("user-devices").replaceChildren(
    ...(u.devices.length
      ? u.devices.map((d) => {
          const tr = el("tr");
          tr.dataset.device = d.device_id;
          const state = d.alive ? (d.active ? "alive, active" : "alive, idle") : "expired";
          const expires = d.expires_at ? ago(d.expires_at, now) : d.owner ? `held by node lease ${d.owner}` : "—";
          tr.append(
            el("td", "", d.device_id),
            el("td", "", ago(d.last_beat, now)),
            el("td", "", d.last_active ? ago(d.last_active, now) : d.alive ? "held active by its socket" : "never"),
            el("td", "", expires),
            el("td", "", state),
          );
          return tr;
        })
      : [(() => {
          const tr = el("tr");
          const td = el("td", "", "no devices");
          td.colSpan = 5;
          tr.append(td);
          return tr;
        })()]),
  );
  const v = u.viewer;
  $("viewer-view").hidden = !v;
  if (v) {
    $("viewer-name").textContent = v.viewer_id;
    const st = v.sees.status ?? "hidden";
    $("viewer-status").textContent = v.sees.status ?? "no status (hidden)";
    $("viewer-status").dataset.status = st;
    $("viewer-relation").textContent = `relation: ${v.relation}` + (v.sees.last_seen ? `, last seen ${when(v.sees.last_seen)}` : ", no last seen");
    $("viewer-why").textContent = v.why;
  }
  $("user-view").hidden = false;
}

// A key kept in this tab signs in again on reload.
const kept = sessionStorage.getItem(KEY);
if (kept) signIn(kept);

// The demo page of presenced: sign in, watch contacts, set your status,
// and see who is here in the page's room, "demo": the page joins it and
// watches it. Everything about the protocol lives in presence.js; this
// file only draws.
//
// The session (who is signed in) lives in sessionStorage, so a reload keeps
// the tab signed in as the same device; the contact list lives in
// localStorage per user. Each contact row and each row of the room carries
// data-user-id and data-status (online, away, busy, offline, hidden,
// unknown) for tests; the room's count carries data-count.

import { PresenceClient, idProblem } from "./presence.js";

const $ = (sel) => document.querySelector(sel);
const SESSION_KEY = "presenced.demo.session";
const ROOM = "demo"; // the page's room: everyone signed in on the page
// Errors of room messages go to the room's panel, the others to the contacts'.
const ROOM_ERRORS = new Set(["room_not_allowed", "rooms_unavailable", "too_many_rooms", "too_many_watched_rooms", "device_not_alive"]);
const LABELS = {
  online: "Online",
  away: "Away",
  busy: "Busy",
  offline: "Offline",
  invisible: "Invisible",
  hidden: "Status hidden",
  unknown: "…",
};
const rtf = new Intl.RelativeTimeFormat(undefined, { numeric: "auto" });
const dtf = new Intl.DateTimeFormat(undefined, { dateStyle: "medium", timeStyle: "medium" });

let client = null;
let me = null; // user id signed in
let signInToken = null; // the token pasted at sign-in, if any
let contacts = []; // ids, in the order added
let members = new Map(); // the room's members: user id → status (null: hidden)

// --- session ---

function signIn({ userId, token }) {
  client?.close();
  client = new PresenceClient(token ? { token } : { userId });
  me = userId || null;
  signInToken = token || null;
  client.addEventListener("welcome", (e) => {
    me = e.detail.user_id;
    sessionStorage.setItem(SESSION_KEY, JSON.stringify({ userId: me, token: token || null }));
    // A token names its user only now: the header said "Connected".
    if ($("#conn").dataset.state === "open") $("#conn").textContent = `Connected as ${me}`;
    showSignedIn();
  });
  client.addEventListener("state", (e) => showConnection(e.detail));
  client.addEventListener("presence", (e) => {
    if (e.detail.user_id === me) showMe(e.detail);
    else renderContact(e.detail);
  });
  client.addEventListener("servererror", (e) => {
    if (ROOM_ERRORS.has(e.detail.code)) showRoomError(e.detail);
    else $("#add-error").textContent = `${e.detail.code}: ${e.detail.message}`;
  });
  client.addEventListener("room", (e) => {
    members = new Map(Object.entries(e.detail.members));
    drawRoom(e.detail.count);
  });
  client.addEventListener("roomchange", (e) => {
    const { event, user_id, status, count } = e.detail;
    if (event === "leave") members.delete(user_id);
    else members.set(user_id, status);
    drawRoom(count);
    if (event !== "status" && user_id !== me) $("#announce").textContent = `${user_id} ${event === "join" ? "joined" : "left"} the room`;
  });
  // A big room (interval mode) tells what changed once per interval, ids
  // only; the client's view of the room is what to draw.
  client.addEventListener("roominterval", (e) => {
    const view = client.getRoom(ROOM);
    if (!view) return;
    members = new Map(Object.entries(view.members));
    drawRoom(e.detail.count);
  });
  client.start();
  members = new Map();
  $("#room-list").replaceChildren();
  $("#room-note").textContent = "";
  $("#room-name").textContent = ROOM;
  client.join(ROOM);
  client.watchRoom(ROOM);
  if (me) watch();
}

// watch subscribes to the contacts of the signed-in user and to the user
// themself (the page shows the user's own status as the server sees it).
function watch() {
  contacts = loadContacts(me);
  $("#contact-list").replaceChildren(...contacts.map(rowFor));
  updateEmpty();
  client.subscribe([me, ...contacts]);
}

function showSignedIn() {
  if (!contacts.length && !$("#contact-list").children.length) watch();
  $("#signin").hidden = true;
  $("#me").hidden = false;
  $("#room").hidden = false;
  $("#contacts").hidden = false;
  $("#me-name").textContent = me;
  document.title = `${me} — presenced`;
}

function signOut() {
  client?.bye();
  client = null;
  me = null;
  contacts = [];
  sessionStorage.removeItem(SESSION_KEY);
  $("#contact-list").replaceChildren();
  members = new Map();
  $("#room-list").replaceChildren();
  $("#me").hidden = true;
  $("#room").hidden = true;
  $("#contacts").hidden = true;
  $("#signin").hidden = false;
  $("#conn").dataset.state = "closed";
  $("#conn").textContent = "Signed out";
  document.title = "presenced — who is online";
  $("#user-id").focus();
}

function showConnection({ state, retryInMs, code }) {
  const conn = $("#conn");
  conn.dataset.state = state;
  switch (state) {
    case "connecting":
      conn.textContent = "Connecting…";
      break;
    case "open":
      conn.textContent = me ? `Connected as ${me}` : "Connected";
      $("#signin-error").textContent = "";
      break;
    case "waiting":
      conn.textContent = `Connection lost — retrying in ${Math.ceil(retryInMs / 1000)} s`;
      if (!$("#signin").hidden) {
        $("#signin-error").textContent = "Could not connect. Is presenced running with -dev (or is the token valid)?";
        explainRefusal();
      }
      break;
    case "closed":
      // A pasted token cannot be renewed (an app passes presence.js a
      // function that fetches fresh ones from its backend).
      conn.textContent = code === 4003 ? "Your token expired — sign out and in with a fresh one" : "Not connected";
      break;
  }
}

// explainRefusal runs when a sign-in has not connected yet. A browser is
// not told why an upgrade failed, so ask the API the same question: if it
// refuses a request without credentials, the server is not running with
// -dev (or the token is bad) and retrying cannot help: stop and say so.
async function explainRefusal() {
  const tried = client;
  let status = 0;
  try {
    const path = me ? `/v1/presence/${encodeURIComponent(me)}` : "/v1/presence/probe";
    const res = await fetch(path, signInToken ? { headers: { Authorization: `Bearer ${signInToken}` } } : {});
    status = res.status;
  } catch {
    return; // the server is unreachable: keep retrying
  }
  if (status !== 401 || client !== tried || $("#signin").hidden) return;
  client?.close();
  client = null;
  $("#conn").dataset.state = "closed";
  $("#conn").textContent = "Not connected";
  $("#signin-error").textContent = me
    ? "The server refused to sign in without a token: it is not running with -dev. Paste a token (presenced -print-token " + me + ")."
    : "The server refused the token (expired, or signed with another secret). Paste a fresh one.";
}

function showMe(view) {
  // The server sends the user their own status as it is (invisible
  // included), in the snapshot and in every live change.
  const status = view.status ?? "unknown";
  $("#me-dot").dataset.status = status;
  $("#me-label").textContent = `· ${LABELS[status] ?? status}`;
  const radio = document.querySelector(`input[name=status][value="${status}"]`);
  if (radio) radio.checked = true;
  updateHint();
  if (document.activeElement !== $("#status-text")) $("#status-text").value = view.status_text ?? "";
}

// --- the room ---

// drawRoom shows the room's members, the user first, then by id, and
// how many are here.
function drawRoom(count) {
  const ids = [...members.keys()].sort((a, b) => (b === me) - (a === me) || (a < b ? -1 : a > b ? 1 : 0));
  $("#room-list").replaceChildren(
    ...ids.map((id) => {
      const li = $("#member-row").content.firstElementChild.cloneNode(true);
      const status = members.get(id) ?? "hidden";
      li.dataset.userId = id;
      li.dataset.status = status;
      li.querySelector(".dot").dataset.status = status;
      li.querySelector(".name").textContent = id === me ? `${id} (you)` : id;
      li.querySelector(".label").textContent = LABELS[status] ?? status;
      return li;
    }),
  );
  const el = $("#room-count");
  el.dataset.count = String(count);
  el.textContent = count === 1 ? "1 here" : `${count} here`;
}

function showRoomError({ code, message }) {
  $("#room-note").textContent =
    code === "room_not_allowed"
      ? `Your token does not let you into the room "${ROOM}": its rooms claim must allow it (presenced -print-token ${me ?? "ID"} -print-token-rooms ${ROOM}).`
      : `${code}: ${message}`;
}

// --- contacts ---

function loadContacts(user) {
  try {
    const ids = JSON.parse(localStorage.getItem(`presenced.demo.contacts.${user}`) || "[]");
    return Array.isArray(ids) ? ids.filter((x) => !idProblem(x) && x !== user) : [];
  } catch {
    return [];
  }
}

function saveContacts() {
  try {
    localStorage.setItem(`presenced.demo.contacts.${me}`, JSON.stringify(contacts));
  } catch {
    /* storage full or disabled: the list lasts as long as the page */
  }
}

function addContact(id) {
  $("#add-error").textContent = "";
  if (!id) return;
  const problem = idProblem(id);
  if (problem) {
    $("#add-error").textContent = `Not a user id: ${problem}.`;
    return;
  }
  if (id === me) {
    $("#add-error").textContent = "That is you.";
    return;
  }
  if (contacts.includes(id)) {
    rowOf(id)?.querySelector(".name").focus?.();
    return;
  }
  contacts.push(id);
  saveContacts();
  $("#contact-list").append(rowFor(id));
  updateEmpty();
  client.subscribe([id]);
}

function removeContact(id) {
  contacts = contacts.filter((x) => x !== id);
  saveContacts();
  rowOf(id)?.remove();
  updateEmpty();
  client.unsubscribe([id]);
  $("#add-id").focus();
}

function rowOf(id) {
  for (const li of $("#contact-list").children) if (li.dataset.userId === id) return li;
  return null;
}

function rowFor(id) {
  const li = $("#contact-row").content.firstElementChild.cloneNode(true);
  li.dataset.userId = id;
  li.querySelector(".name").textContent = id;
  const rm = li.querySelector(".remove");
  rm.setAttribute("aria-label", `Remove ${id}`);
  rm.addEventListener("click", () => removeContact(id));
  const view = client?.get(id);
  if (view) fillRow(li, view);
  return li;
}

function renderContact(view) {
  const li = rowOf(view.user_id);
  if (!li) return;
  const before = li.dataset.status;
  fillRow(li, view);
  // Tell screen readers about live changes (not the first state of a row).
  if (before !== "unknown" && before !== li.dataset.status) {
    $("#announce").textContent = `${view.user_id} is now ${LABELS[li.dataset.status].toLowerCase()}`;
  }
}

function fillRow(li, view) {
  const status = view.status ?? "hidden";
  li.dataset.status = status;
  li.dataset.version = String(view.version);
  li.querySelector(".dot").dataset.status = status;
  li.querySelector(".label").textContent = LABELS[status] ?? status;
  li.querySelector(".text").textContent = view.status_text ?? "";
  const seen = li.querySelector(".seen");
  if (status === "offline" && view.last_seen) {
    seen.dateTime = view.last_seen;
    seen.title = dtf.format(new Date(view.last_seen));
  } else {
    seen.removeAttribute("datetime");
    seen.removeAttribute("title");
  }
  refreshSeen(seen);
}

// refreshSeen writes "last seen 3 minutes ago" from the datetime attribute.
function refreshSeen(el) {
  const iso = el.getAttribute("datetime");
  if (!iso) {
    el.textContent = el.closest("li")?.dataset.status === "offline" ? "never seen" : "";
    return;
  }
  el.textContent = `last seen ${relative(new Date(iso))}`;
}

function relative(t) {
  const secs = Math.round((t.getTime() - Date.now()) / 1000);
  const abs = Math.abs(secs);
  if (abs < 45) return "just now";
  const steps = [
    [3600, 60, "minute"],
    [86400, 3600, "hour"],
    [86400 * 30, 86400, "day"],
    [86400 * 365, 86400 * 30, "month"],
  ];
  for (const [limit, unit, name] of steps) if (abs < limit) return rtf.format(Math.round(secs / unit), name);
  return rtf.format(Math.round(secs / (86400 * 365)), "year");
}

function updateEmpty() {
  $("#empty").hidden = contacts.length > 0;
}

// --- wiring ---

$("#signin-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const userId = $("#user-id").value.trim();
  const token = $("#token").value.trim();
  $("#signin-error").textContent = "";
  if (!userId && !token) {
    $("#signin-error").textContent = "Enter a user id (or a token).";
    return;
  }
  if (!token && idProblem(userId)) {
    $("#signin-error").textContent = `Not a user id: ${idProblem(userId)}.`;
    return;
  }
  signIn(token ? { token } : { userId });
});

$("#status-form").addEventListener("submit", (e) => {
  e.preventDefault();
  sendStatus();
});

for (const radio of document.querySelectorAll("input[name=status]")) {
  radio.addEventListener("change", sendStatus);
}

// The hint explains invisible, and shows only while it is chosen.
function updateHint() {
  $("#status-hint").hidden = !document.querySelector('input[name=status][value="invisible"]')?.checked;
}

function sendStatus() {
  updateHint();
  const status = document.querySelector("input[name=status]:checked")?.value ?? "online";
  client?.setStatus(status, $("#status-text").value.trim());
}

$("#add-form").addEventListener("submit", (e) => {
  e.preventDefault();
  addContact($("#add-id").value.trim());
  $("#add-id").value = "";
});

$("#signout").addEventListener("click", signOut);

setInterval(() => document.querySelectorAll(".contact .seen").forEach(refreshSeen), 5000);

// A reload keeps the tab signed in (same device: watchers see nothing).
try {
  const saved = JSON.parse(sessionStorage.getItem(SESSION_KEY) || "null");
  if (saved && (saved.userId || saved.token)) signIn(saved.token ? { token: saved.token } : { userId: saved.userId });
} catch {
  sessionStorage.removeItem(SESSION_KEY);
}

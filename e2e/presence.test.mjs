// Unit tests of js/presence/presence.js under node's test runner,
// with a fake WebSocket and mocked timers (run by client_test.go, or
// directly: node --test e2e/). The browser test covers the real thing.

import { test, mock, beforeEach, afterEach } from "node:test";
import assert from "node:assert/strict";
import { PresenceClient, idProblem } from "../js/presence/presence.js";

class FakeSocket {
  static CONNECTING = 0;
  static OPEN = 1;
  static CLOSING = 2;
  static CLOSED = 3;
  static all = [];
  constructor(url) {
    this.url = new URL(url);
    this.readyState = FakeSocket.CONNECTING;
    this.sent = [];
    FakeSocket.all.push(this);
  }
  send(data) {
    assert.equal(this.readyState, FakeSocket.OPEN, "send on a socket that is not open");
    this.sent.push(JSON.parse(data));
  }
  close(code = 1000) {
    if (this.readyState === FakeSocket.CLOSED) return;
    this.readyState = FakeSocket.CLOSED;
    this.onclose?.({ code });
  }
  // server side
  open(welcome = {}) {
    this.readyState = FakeSocket.OPEN;
    this.recv({ type: "welcome", user_id: "42", device_id: "d-1", heartbeat_interval_ms: 1000, ttl_ms: 4000, ...welcome });
  }
  recv(msg) {
    this.onmessage?.({ data: JSON.stringify(msg) });
  }
  drop(code = 1006) {
    this.readyState = FakeSocket.CLOSED;
    this.onclose?.({ code });
  }
  ofType(type) {
    return this.sent.filter((m) => m.type === type);
  }
}

class MemoryStorage {
  constructor() {
    this.m = new Map();
  }
  getItem(k) {
    return this.m.has(k) ? this.m.get(k) : null;
  }
  setItem(k, v) {
    this.m.set(k, String(v));
  }
  removeItem(k) {
    this.m.delete(k);
  }
}

const last = () => FakeSocket.all.at(-1);

beforeEach(() => {
  FakeSocket.all = [];
  globalThis.WebSocket = FakeSocket;
  mock.timers.enable({ apis: ["setTimeout", "Date"] });
});

afterEach(() => {
  mock.timers.reset();
  mock.restoreAll();
});

function client(opts = {}) {
  return new PresenceClient({ userId: "42", url: "ws://presence.test/v1/ws", storage: new MemoryStorage(), ...opts });
}

test("keeps the device id of the welcome and reconnects with it", () => {
  const storage = new MemoryStorage();
  const c = client({ storage });
  c.start();
  assert.equal(last().url.searchParams.get("user_id"), "42");
  assert.equal(last().url.searchParams.get("device_id"), null);
  last().open({ device_id: "d-7f3a" });
  assert.equal(storage.getItem("presenced.device.42"), "d-7f3a");
  last().drop();
  mock.timers.tick(1000); // first retry within 0.25–0.5 s
  assert.equal(FakeSocket.all.length, 2);
  assert.equal(last().url.searchParams.get("device_id"), "d-7f3a");
  // A new client in the same tab (a reload) is the same device.
  const again = client({ storage });
  again.start();
  assert.equal(last().url.searchParams.get("device_id"), "d-7f3a");
});

test("storage: null keeps the device id nowhere, even where the page has a sessionStorage", () => {
  const session = new MemoryStorage();
  const had = Object.getOwnPropertyDescriptor(globalThis, "sessionStorage");
  Object.defineProperty(globalThis, "sessionStorage", { value: session, configurable: true });
  try {
    assert.equal(new PresenceClient({ userId: "42", url: "ws://presence.test/v1/ws" }).storage, session);
    const c = new PresenceClient({ userId: "42", url: "ws://presence.test/v1/ws", storage: null });
    assert.equal(c.storage, null);
    c.start();
    last().open({ device_id: "d-1" });
    assert.equal(session.getItem("presenced.device.42"), null);
  } finally {
    if (had) Object.defineProperty(globalThis, "sessionStorage", had);
    else delete globalThis.sessionStorage;
  }
});

test("a token goes in the query instead of the user id", () => {
  const c = new PresenceClient({ token: "t.o.k", url: "ws://presence.test/v1/ws", storage: new MemoryStorage() });
  c.start();
  assert.equal(last().url.searchParams.get("token"), "t.o.k");
  assert.equal(last().url.searchParams.get("user_id"), null);
});

// flush lets pending promises (a token function's answer) settle; timers
// are mocked, setImmediate is not.
const flush = () => new Promise((resolve) => setImmediate(resolve));

test("a token function is asked before every connection; an expiry close (4003) comes back with a fresh token as the same device", async () => {
  let n = 0;
  const states = [];
  const c = new PresenceClient({ token: async () => `t${++n}`, url: "ws://presence.test/v1/ws", storage: new MemoryStorage() });
  c.addEventListener("state", (e) => states.push(e.detail));
  c.start();
  await flush();
  assert.equal(FakeSocket.all.length, 1);
  assert.equal(last().url.searchParams.get("token"), "t1");
  last().open({ device_id: "d-7" });
  c.subscribe(["2"]);
  last().drop(4003);
  assert.deepEqual(states.at(-1), { state: "waiting", retryInMs: states.at(-1).retryInMs, code: 4003 });
  assert.ok(states.at(-1).retryInMs <= 500, `first retry in ${states.at(-1).retryInMs} ms`);
  mock.timers.tick(500);
  await flush();
  assert.equal(FakeSocket.all.length, 2);
  assert.equal(last().url.searchParams.get("token"), "t2", "a fresh token");
  assert.equal(last().url.searchParams.get("device_id"), "d-7", "the same device");
  last().open({ device_id: "d-7" });
  assert.deepEqual(last().ofType("subscribe"), [{ type: "subscribe", user_ids: ["2"] }]);
  assert.equal(c.token, "t2");
});

test("a fixed token stops at its expiry close instead of retrying a token the server refuses", () => {
  const states = [];
  const c = new PresenceClient({ token: "t.o.k", url: "ws://presence.test/v1/ws", storage: new MemoryStorage() });
  c.addEventListener("state", (e) => states.push(e.detail));
  c.start();
  last().open();
  last().drop(4003);
  assert.deepEqual(states.at(-1), { state: "closed", code: 4003 });
  mock.timers.tick(60_000);
  assert.equal(FakeSocket.all.length, 1, "no reconnect");
  // Any other drop is retried, as before.
  const d = new PresenceClient({ token: "t.o.k", url: "ws://presence.test/v1/ws", storage: new MemoryStorage() });
  d.start();
  last().open();
  last().drop(4001);
  mock.timers.tick(1000);
  assert.equal(FakeSocket.all.length, 3);
});

test("a token function that fails is retried with backoff; stopping during a fetch opens nothing", async () => {
  let fail = true;
  const c = new PresenceClient({
    token: async () => {
      if (fail) throw new Error("backend down");
      return "t.o.k";
    },
    url: "ws://presence.test/v1/ws",
    storage: new MemoryStorage(),
  });
  const states = [];
  c.addEventListener("state", (e) => states.push(e.detail.state));
  c.start();
  await flush();
  assert.equal(FakeSocket.all.length, 0);
  assert.equal(states.at(-1), "waiting");
  fail = false;
  mock.timers.tick(500);
  await flush();
  assert.equal(FakeSocket.all.length, 1);
  assert.equal(last().url.searchParams.get("token"), "t.o.k");

  let release;
  const d = new PresenceClient({
    token: () => new Promise((resolve) => (release = resolve)),
    url: "ws://presence.test/v1/ws",
    storage: new MemoryStorage(),
  });
  d.start();
  d.close();
  release("late");
  await flush();
  assert.equal(FakeSocket.all.length, 1, "a token that arrives after close opens no socket");
  assert.equal(d.state, "closed");
});

test("bye over HTTP with a token function sends a fresh token", async () => {
  const calls = [];
  mock.method(globalThis, "fetch", async (url, init) => {
    calls.push([url, init.headers.Authorization, JSON.parse(init.body)]);
    return new Response("{}");
  });
  let n = 0;
  const c = new PresenceClient({ token: () => `t${++n}`, url: "ws://presence.test/v1/ws", storage: new MemoryStorage() });
  c.start();
  await flush();
  last().open({ device_id: "d-9" });
  last().drop();
  c.bye();
  await flush();
  assert.deepEqual(calls, [["http://presence.test/v1/bye", "Bearer t2", { device_id: "d-9" }]]);
});

test("applies presence only above the last version, snapshots included", () => {
  const c = client();
  const got = [];
  c.addEventListener("presence", (e) => got.push([e.detail.user_id, e.detail.status, e.detail.version]));
  c.start();
  last().open();
  c.subscribe(["2", "3"]);
  assert.deepEqual(last().ofType("subscribe"), [{ type: "subscribe", user_ids: ["2", "3"] }]);
  last().recv({
    type: "snapshot",
    users: {
      2: { status: "online", last_seen: null, status_text: null, version: 10 },
      3: { status: null, last_seen: null, status_text: null, version: 0 },
    },
  });
  last().recv({ type: "presence", user_id: "2", status: "away", version: 9 }); // stale
  last().recv({ type: "presence", user_id: "2", status: "away", version: 10 }); // duplicate
  last().recv({ type: "presence", user_id: "2", status: "busy", version: 11 });
  last().recv({ type: "presence", user_id: "9", status: "busy", version: 1 }); // not watched
  assert.deepEqual(got, [
    ["2", "online", 10],
    ["3", null, 0],
    ["2", "busy", 11],
  ]);
  assert.equal(c.get("2").status, "busy");
});

test("after a reconnect: subscribes again, sends a status set while away, and stale snapshots stay dropped", () => {
  const c = client();
  const got = [];
  c.addEventListener("presence", (e) => got.push([e.detail.status, e.detail.version]));
  c.start();
  last().open();
  c.subscribe(["2"]);
  last().recv({ type: "presence", user_id: "2", status: "online", version: 5 });
  last().drop();
  c.subscribe(["3"]); // while disconnected: remembered
  c.setStatus("busy", "in a meeting");
  mock.timers.tick(1000);
  last().open();
  assert.deepEqual(last().ofType("subscribe"), [{ type: "subscribe", user_ids: ["2", "3"] }]);
  assert.deepEqual(last().ofType("set_status"), [{ type: "set_status", status: "busy", text: "in a meeting" }]);
  last().recv({ type: "snapshot", users: { 2: { status: "online", version: 5 }, 3: { status: "away", version: 1 } } });
  last().recv({ type: "snapshot", users: { 2: { status: "offline", version: 6 } } });
  assert.deepEqual(got, [
    ["online", 5],
    ["away", 1],
    ["offline", 6],
  ]);
});

test("heartbeats come every interval ±10%, active unless idle", () => {
  const c = client({ inactiveAfterMs: 5000 });
  c.start();
  const ws = last();
  const beats = [];
  const send = ws.send.bind(ws);
  ws.send = (d) => {
    if (JSON.parse(d).type === "heartbeat") beats.push([Date.now(), JSON.parse(d)]);
    send(d);
  };
  const t0 = Date.now();
  ws.open(); // interval 1000 ms
  for (let i = 0; i < 600; i++) mock.timers.tick(100); // (timers set while ticking fire on a later tick)
  assert.ok(beats.length >= 54 && beats.length <= 67, `${beats.length} beats in 60 s`);
  let prev = t0;
  for (const [t] of beats) {
    assert.ok(t - prev >= 900 && t - prev <= 1100, `a beat ${t - prev} ms after the last`);
    prev = t;
  }
  // Active while there was input within 5 s (none since the start), then not.
  for (const [t, msg] of beats) {
    const want = t - t0 < 5000 ? { type: "heartbeat" } : { type: "heartbeat", active: false };
    assert.deepEqual(msg, want, `beat at ${t - t0} ms`);
  }
});

test("reconnects with growing, jittered, capped waits", () => {
  mock.method(Math, "random", () => 1); // the longest wait of each step
  const c = client();
  const waits = [];
  c.addEventListener("state", (e) => e.detail.state === "waiting" && waits.push(e.detail.retryInMs));
  c.start();
  for (let i = 0; i < 10; i++) {
    last().drop();
    mock.timers.tick(waits.at(-1));
  }
  assert.deepEqual(waits, [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000]);
  // A welcome resets the backoff.
  last().open();
  last().drop();
  assert.equal(waits.at(-1), 500);
  Math.random.mock.mockImplementation(() => 0); // the shortest: half the step
  mock.timers.tick(500);
  last().drop();
  assert.equal(waits.at(-1), 500);
});

test("bye ends the device over the socket, or over HTTP when the socket is down", async () => {
  const storage = new MemoryStorage();
  const c = client({ storage });
  c.start();
  last().open();
  c.bye();
  assert.deepEqual(last().sent.at(-1), { type: "bye" });
  assert.equal(storage.getItem("presenced.device.42"), null, "the device id is forgotten");
  assert.equal(c.state, "closed");
  mock.timers.tick(60_000);
  assert.equal(FakeSocket.all.length, 1, "no reconnect after bye");

  const calls = [];
  mock.method(globalThis, "fetch", async (url, init) => {
    calls.push([url, init.method, JSON.parse(init.body)]);
    return new Response("{}");
  });
  const d = client();
  d.start();
  last().open({ device_id: "d-9" });
  last().drop();
  d.bye();
  assert.deepEqual(calls, [["http://presence.test/v1/bye", "POST", { device_id: "d-9", user_id: "42" }]]);
});

test("close stops without a goodbye", () => {
  const c = client();
  c.start();
  last().open();
  c.close();
  assert.equal(last().ofType("bye").length, 0);
  mock.timers.tick(60_000);
  assert.equal(FakeSocket.all.length, 1);
});

test("refuses ids the server would refuse", () => {
  const c = client();
  assert.throws(() => c.subscribe(["ok", "not ok"]), /not ok/);
  assert.equal(c.subscriptions.size, 0);
  const invisible = ["ali\u200bce", "a\u200db", "\ufeffa", "a\u00adb", "a\u3164", "a\u00a0b", "a\u3000b", "a\ufe0fb", "a\u{e0041}", "a\ufffd"];
  const notNFC = ["cafe\u0301", "\u212a", "\u2126"];
  for (const bad of ["", "a,b", "x".repeat(65), "\u202e", "tab\t", ...invisible, ...notNFC]) assert.notEqual(idProblem(bad), "", JSON.stringify(bad));
  for (const good of ["42", "550e8400-e29b-41d4-a716-446655440000", "jürgen", "x".repeat(64), "名前", "🙂", "a\u2027b", "caf\u00e9", "\uff21", "\u0430"]) {
    assert.equal(idProblem(good), "", good);
  }
  assert.throws(() => c.setStatus("sleeping"), /unknown status/);
});

test("refuses options it cannot connect with", () => {
  const url = "ws://presence.test/v1/ws";
  assert.throws(() => new PresenceClient({ url }), /userId or token is required/);
  assert.throws(() => new PresenceClient({ url, token: 42 }), /token must be a string or a function/);
  assert.throws(() => new PresenceClient({ url, token: { jwt: "t.o.k" } }), /token must be a string or a function/);
});

test("rooms: join, leave, watch and unwatch go out while open; refused ids throw", () => {
  const c = client();
  c.start();
  last().open();
  c.join("doc-42");
  c.join("doc-42"); // joined already
  c.watchRoom("doc-42");
  c.watchRoom("doc-42");
  c.leave("doc-42");
  c.leave("doc-42"); // not joined
  c.unwatchRoom("doc-42");
  const rooms = last().sent.filter((m) => m.room);
  assert.deepEqual(rooms, [
    { type: "join", room: "doc-42" },
    { type: "watch_room", room: "doc-42" },
    { type: "leave", room: "doc-42" },
    { type: "unwatch_room", room: "doc-42" },
  ]);
  assert.throws(() => c.join("a b"), /room id "a b"/);
  assert.throws(() => c.watchRoom(""), /room id/);
  assert.equal(c.rooms.size + c.watchedRooms.size, 0);
});

test("rooms: the first room message is told as it is, then each change", () => {
  const c = client();
  const got = [];
  c.addEventListener("room", (e) => got.push(["room", e.detail]));
  c.addEventListener("roomchange", (e) => got.push(["change", e.detail]));
  c.start();
  last().open();
  c.watchRoom("r");
  last().recv({ type: "room_change", room: "r", user_id: "z", event: "join", status: "online", count: 1, version: 1 }); // before the room message
  last().recv({ type: "room", room: "r", mode: "events", count: 2, members: { a: "online", b: null }, next: null, version: 7 });
  last().recv({ type: "room_change", room: "r", user_id: "c", event: "join", status: "busy", count: 3, version: 8 });
  last().recv({ type: "room_change", room: "r", user_id: "a", event: "status", status: "away", count: 3, version: 8 });
  last().recv({ type: "room_change", room: "r", user_id: "b", event: "leave", status: null, count: 2, version: 9 });
  last().recv({ type: "room_change", room: "other", user_id: "x", event: "join", status: "online", count: 1, version: 1 }); // not watched
  assert.deepEqual(got, [
    ["room", { room: "r", mode: "events", count: 2, members: { a: "online", b: null }, partial: false, next: null, version: 7 }],
    ["change", { room: "r", user_id: "c", event: "join", status: "busy", count: 3, version: 8, snapshot: false }],
    ["change", { room: "r", user_id: "a", event: "status", status: "away", count: 3, version: 8, snapshot: false }],
    ["change", { room: "r", user_id: "b", event: "leave", status: null, count: 2, version: 9, snapshot: false }],
  ]);
  assert.deepEqual(c.getRoom("r"), { room: "r", mode: "events", count: 2, members: { a: "away", c: "busy" }, partial: false, next: null, version: 9 });
  c.getRoom("r").members.a = "changed by the app";
  assert.equal(c.getRoom("r").members.a, "away", "getRoom gives a copy");
  c.unwatchRoom("r");
  last().recv({ type: "room_change", room: "r", user_id: "d", event: "join", status: "online", count: 3, version: 10 });
  assert.equal(got.length, 4, "nothing after unwatchRoom");
  assert.equal(c.getRoom("r"), undefined);
});

test("rooms: a change of status the view holds already is no roomchange", () => {
  const c = client();
  const got = [];
  c.addEventListener("roomchange", (e) => got.push(e.detail));
  c.start();
  last().open();
  c.watchRoom("r");
  last().recv({ type: "room", room: "r", mode: "events", count: 1, members: { a: "online" }, next: null, version: 7 });
  last().recv({ type: "room_change", room: "r", user_id: "a", event: "status", status: "online", count: 1, version: 7 });
  last().recv({ type: "room_change", room: "r", user_id: "a", event: "status", status: "busy", count: 1, version: 7 });
  assert.deepEqual(got, [{ room: "r", user_id: "a", event: "status", status: "busy", count: 1, version: 7, snapshot: false }]);
});

test("rooms: a big room in interval mode: roominterval events move the view; a switch of mode is a room event; a reconnect tells what differs as one roominterval", () => {
  const c = client();
  const got = [];
  c.addEventListener("room", (e) => got.push(["room", e.detail]));
  c.addEventListener("roomchange", (e) => got.push(["change", e.detail]));
  c.addEventListener("roominterval", (e) => got.push(["interval", e.detail]));
  c.start();
  last().open();
  c.watchRoom("big");
  last().recv({ type: "room_interval", room: "big", count: 9, joined: ["z"], left: [], more_joined: 0, more_left: 0, version: 1 }); // before the room message
  last().recv({ type: "room", room: "big", mode: "interval", count: 1500, members: { a: "online", b: null }, next: "b", version: 40 });
  last().recv({ type: "room_interval", room: "big", count: 1501, joined: ["c", "d"], left: ["a"], more_joined: 3, more_left: 2, version: 47 });
  last().recv({ type: "room_interval", room: "other", count: 5, joined: ["x"], left: [], more_joined: 0, more_left: 0, version: 3 }); // not watched
  assert.deepEqual(got, [
    ["room", { room: "big", mode: "interval", count: 1500, members: { a: "online", b: null }, partial: true, next: "b", version: 40 }],
    ["interval", { room: "big", count: 1501, joined: ["c", "d"], left: ["a"], more_joined: 3, more_left: 2, version: 47, snapshot: false }],
  ]);
  assert.deepEqual(c.getRoom("big"), { room: "big", mode: "interval", count: 1501, members: { b: null, c: null, d: null }, partial: true, next: "b", version: 47 });
  // Back to events mode, then into interval mode again with every member listed: each a room event.
  got.length = 0;
  last().recv({ type: "room", room: "big", mode: "events", count: 2, members: { b: "busy", c: "online" }, next: null, version: 90 });
  last().recv({ type: "room", room: "big", mode: "interval", count: 3, members: { b: "busy", c: "online", e: "away" }, next: null, version: 91 });
  assert.deepEqual(
    got.map(([kind, d]) => `${kind} ${d.mode} ${d.count} ${Object.keys(d.members)}`),
    ["room events 2 b,c", "room interval 3 b,c,e"],
  );
  // A reconnect: the same room tells nothing; one left, one joined, one
  // changed status: one roominterval (statuses go to the view only).
  got.length = 0;
  last().drop();
  mock.timers.tick(1000);
  last().open();
  last().recv({ type: "room", room: "big", mode: "interval", count: 3, members: { b: "busy", c: "online", e: "away" }, next: null, version: 91 });
  assert.deepEqual(got, []);
  last().recv({ type: "room", room: "big", mode: "interval", count: 3, members: { b: "online", e: "away", f: null }, next: null, version: 93 });
  assert.deepEqual(got, [["interval", { room: "big", count: 3, joined: ["f"], left: ["c"], more_joined: 0, more_left: 0, version: 93, snapshot: true }]]);
  assert.deepEqual(c.getRoom("big").members, { b: "online", e: "away", f: null });
});

test("rooms: a reconnect sends the leaves made while away, then joins and watches again; the fresh room message tells only what differs", () => {
  const c = client();
  const got = [];
  c.addEventListener("room", (e) => got.push(`room ${Object.keys(e.detail.members)}`));
  c.addEventListener("roomchange", (e) => {
    const d = e.detail;
    got.push(`${d.event} ${d.user_id} ${d.status} ${d.count}${d.snapshot ? " snapshot" : ""}`);
  });
  c.start();
  last().open();
  c.join("a");
  c.join("b");
  c.watchRoom("w");
  last().recv({ type: "room", room: "w", mode: "events", count: 3, members: { me: "online", p: "online", q: "busy" }, next: null, version: 4 });
  last().drop();
  c.leave("b"); // away: goes out on the next connection
  c.join("c");
  c.unwatchRoom("gone"); // never watched: nothing
  mock.timers.tick(1000);
  last().open();
  assert.deepEqual(
    last().sent.filter((m) => m.room),
    [
      { type: "leave", room: "b" },
      { type: "join", room: "a" },
      { type: "join", room: "c" },
      { type: "watch_room", room: "w" },
    ],
  );
  assert.deepEqual(Object.keys(c.getRoom("w").members), ["me", "p", "q"], "the view stays while the room message is on its way");
  // Same members: nothing. Then one who left meanwhile, one who joined, one who changed.
  last().recv({ type: "room", room: "w", mode: "events", count: 3, members: { me: "online", p: "online", q: "busy" }, next: null, version: 4 });
  assert.deepEqual(got, ["room me,p,q"]);
  last().recv({ type: "room", room: "w", mode: "events", count: 3, members: { me: "online", q: "away", r: null }, next: null, version: 6 });
  assert.deepEqual(got, ["room me,p,q", "leave p null 2 snapshot", "join r null 3 snapshot", "status q away 3 snapshot"]);
  // A second drop: the leave went out already, and is not sent again.
  last().drop();
  mock.timers.tick(1000);
  last().open();
  assert.deepEqual(
    last().sent.filter((m) => m.room).map((m) => `${m.type} ${m.room}`),
    ["join a", "join c", "watch_room w"],
  );
});

test("rooms: messages are paced below the server's rate", () => {
  const c = client();
  c.start();
  last().open();
  for (let i = 0; i < 60; i++) c.join(`r${i}`);
  const joins = () => last().ofType("join").length;
  assert.equal(joins(), 24, "a burst at once");
  mock.timers.tick(1000);
  assert.ok(joins() >= 24 + 13 && joins() <= 24 + 16, `${joins()} joins after a second more`);
  for (let i = 0; i < 30; i++) mock.timers.tick(100);
  assert.deepEqual(
    last().ofType("join").map((m) => m.room),
    Array.from({ length: 60 }, (_, i) => `r${i}`),
    "all of them, in order",
  );
});

test("rooms: a join or watch refused with a code a retry cures is sent again after a backoff, while wanted and while the socket lasts", () => {
  const c = client();
  const errors = [];
  c.addEventListener("servererror", (e) => errors.push(e.detail));
  c.start();
  last().open();
  c.join("doc");
  c.watchRoom("call");
  c.join("gone");
  const sentRooms = (ws) => ws.sent.filter((m) => m.room).map((m) => `${m.type} ${m.room}`);
  const first = last();
  const before = first.sent.length;
  first.recv({ type: "error", code: "unavailable", room: "doc", message: "retry later" });
  first.recv({ type: "error", code: "unavailable", room: "call", message: "retry later" });
  first.recv({ type: "error", code: "rate_limited", room: "gone", message: "retry in 1s" });
  assert.deepEqual(
    errors.map((e) => `${e.code} ${e.room}`),
    ["unavailable doc", "unavailable call", "rate_limited gone"],
    "the errors are told, naming their rooms",
  );
  assert.deepEqual([...c.rooms], ["doc", "gone"], "kept: the client retries them");
  assert.deepEqual([...c.watchedRooms], ["call"]);
  c.leave("gone"); // no longer wanted: its retry sends nothing
  assert.deepEqual(sentRooms({ sent: first.sent.slice(before) }), ["leave gone"]);
  mock.timers.tick(500); // the first retry within 0.25–0.5 s
  assert.deepEqual(sentRooms({ sent: first.sent.slice(before) }).sort(), ["join doc", "leave gone", "watch_room call"]);

  // Refused again: the next wait is longer (0.5–1 s).
  const again = first.sent.length;
  first.recv({ type: "error", code: "unavailable", room: "doc", message: "retry later" });
  mock.timers.tick(249);
  assert.equal(first.sent.length, again, "not before a quarter second");
  mock.timers.tick(751);
  assert.deepEqual(sentRooms({ sent: first.sent.slice(again) }), ["join doc"]);

  // device_not_alive: a heartbeat goes first.
  const beat = first.sent.length;
  first.recv({ type: "error", code: "device_not_alive", room: "doc", message: "send a heartbeat first" });
  mock.timers.tick(30_000);
  const after = first.sent.slice(beat);
  const join = after.findIndex((m) => m.type === "join");
  assert.ok(join > 0 && after[join - 1].type === "heartbeat", `a heartbeat right before the join: ${JSON.stringify(after)}`);

  // The socket ends: the retry planned on it is dropped, and the next
  // socket joins and watches everything anyway.
  first.recv({ type: "error", code: "unavailable", room: "doc", message: "retry later" });
  const atDrop = first.sent.length;
  first.drop();
  mock.timers.tick(1000);
  assert.equal(first.sent.length, atDrop);
  last().open();
  assert.deepEqual(sentRooms(last()), ["join doc", "watch_room call"]);
  mock.timers.tick(60_000);
  assert.deepEqual(sentRooms(last()), ["join doc", "watch_room call"], "no retry of the old socket's refusal");
});

test("rooms: a join or watch refused for good is dropped and told, naming its room; an error of no room drops nothing", () => {
  const c = client();
  const errors = [];
  c.addEventListener("servererror", (e) => errors.push(e.detail));
  c.start();
  last().open();
  for (const r of ["a", "b", "w"]) {
    c.join(r);
    c.watchRoom(r);
  }
  last().recv({ type: "room", mode: "events", room: "w", count: 1, members: { 42: "online" }, next: null, version: 3 });
  last().recv({ type: "error", code: "too_many_subscriptions", message: "no room" });
  assert.deepEqual([...c.rooms], ["a", "b", "w"]);
  last().recv({ type: "error", code: "room_not_allowed", room: "a", message: "not in the claim" });
  assert.deepEqual([[...c.rooms], [...c.watchedRooms]], [["b", "w"], ["b", "w"]], "room_not_allowed: the join and the watch");
  last().recv({ type: "error", code: "too_many_rooms", room: "b", message: "leave one first" });
  assert.deepEqual([[...c.rooms], [...c.watchedRooms]], [["w"], ["b", "w"]], "too_many_rooms: the join only");
  last().recv({ type: "error", code: "too_many_watched_rooms", room: "b", message: "unwatch one first" });
  assert.deepEqual([[...c.rooms], [...c.watchedRooms]], [["w"], ["w"]], "too_many_watched_rooms: the watch only");
  // w's watch was answered with its room message: a refusal now is its join's.
  last().recv({ type: "error", code: "rooms_unavailable", room: "w", message: "no rooms here" });
  assert.deepEqual([[...c.rooms], [...c.watchedRooms]], [[], ["w"]]);
  assert.ok(c.getRoom("w"));
  assert.equal(c.getRoom("b"), undefined);
  assert.deepEqual(
    errors.map((e) => `${e.code} ${e.room}`),
    ["too_many_subscriptions undefined", "room_not_allowed a", "too_many_rooms b", "too_many_watched_rooms b", "rooms_unavailable w"],
  );
  const sent = last().sent.length;
  mock.timers.tick(60_000);
  assert.deepEqual(last().sent.slice(sent).filter((m) => m.room), [], "nothing refused for good is sent again");
  // Dropped, a room may be asked for again.
  c.join("b");
  assert.deepEqual(last().sent.at(-1), { type: "join", room: "b" });
});

test("rooms: an error naming its request acts on that message only: the join or the watch", () => {
  const c = client();
  const errors = [];
  c.addEventListener("servererror", (e) => errors.push(e.detail));
  c.start();
  last().open();
  for (const r of ["r", "s", "t"]) {
    c.join(r);
    c.watchRoom(r);
  }
  // Codes both a join and a watch may get: only the message named goes.
  last().recv({ type: "error", code: "rooms_unavailable", request: "watch_room", room: "r", message: "no watching here" });
  assert.deepEqual([[...c.rooms], [...c.watchedRooms]], [["r", "s", "t"], ["s", "t"]], "the watch of r only");
  last().recv({ type: "error", code: "internal", request: "join", room: "s", message: "see the log" });
  assert.deepEqual([[...c.rooms], [...c.watchedRooms]], [["r", "t"], ["s", "t"]], "the join of s only, its watch kept though no room event came");
  assert.deepEqual(
    errors.map((e) => `${e.code} ${e.request} ${e.room}`),
    ["rooms_unavailable watch_room r", "internal join s"],
  );
  // A retry sends the message refused, not the room's other one.
  const before = last().sent.length;
  last().recv({ type: "error", code: "unavailable", request: "watch_room", room: "t", message: "retry later" });
  mock.timers.tick(60_000);
  assert.deepEqual(
    last()
      .sent.slice(before)
      .filter((m) => m.room)
      .map((m) => `${m.type} ${m.room}`),
    ["watch_room t"],
  );
  // A request of a later protocol is not one of ours: nothing changes.
  last().recv({ type: "error", code: "room_not_allowed", request: "knock", room: "t", message: "?" });
  assert.deepEqual([[...c.rooms], [...c.watchedRooms]], [["r", "t"], ["s", "t"]]);
});

test("rooms: a leave or unwatch refused with a code a retry cures is sent again, until the app asks otherwise; a reconnect sends the leave", () => {
  const c = client();
  c.start();
  last().open();
  c.join("doc");
  c.join("call");
  c.watchRoom("w");
  c.leave("doc");
  c.leave("call");
  c.unwatchRoom("w");
  const first = last();
  const roomMsgs = (from) =>
    first.sent
      .slice(from)
      .filter((m) => m.room)
      .map((m) => `${m.type} ${m.room}`);
  let at = first.sent.length;
  first.recv({ type: "error", code: "unavailable", request: "leave", room: "doc", message: "retry later" });
  first.recv({ type: "error", code: "rate_limited", request: "unwatch_room", room: "w", message: "too many" });
  first.recv({ type: "error", code: "room_not_allowed", request: "leave", room: "call", message: "not in the claim" });
  assert.deepEqual([[...c.rooms], [...c.watchedRooms]], [[], []], "a refused leave or unwatch changes what the app asked for in nothing");
  mock.timers.tick(500); // the first retry within 0.25–0.5 s
  assert.deepEqual(roomMsgs(at).sort(), ["leave doc", "unwatch_room w"], "not the leave refused for good");

  // Refused again, then joined before the retry: the join supersedes it.
  at = first.sent.length;
  first.recv({ type: "error", code: "unavailable", request: "leave", room: "doc", message: "retry later" });
  first.recv({ type: "error", code: "rate_limited", request: "unwatch_room", room: "w", message: "too many" });
  c.join("doc");
  c.watchRoom("w");
  mock.timers.tick(60_000);
  assert.deepEqual(roomMsgs(at), ["join doc", "watch_room w"], "no leave nor unwatch after the app's join and watch");

  // A leave refused as the socket ends: the next socket sends it, as the
  // device keeps its rooms through the close grace.
  c.leave("doc");
  first.recv({ type: "error", code: "unavailable", request: "leave", room: "doc", message: "retry later" });
  first.drop();
  mock.timers.tick(1000);
  last().open();
  assert.deepEqual(
    last()
      .sent.filter((m) => m.room)
      .map((m) => `${m.type} ${m.room}`),
    ["leave doc", "watch_room w"],
  );
  mock.timers.tick(60_000);
  assert.equal(last().ofType("leave").length, 1, "the old socket's retry is gone");
});

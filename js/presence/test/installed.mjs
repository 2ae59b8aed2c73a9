// The packed @presenced/presence, installed into an empty directory, used
// by its name from Node against a real presenced node. e2e/npm_test.go
// copies this file beside the install and runs it with
//
//   PRESENCED_URL      http://host:port of a presenced started with -dev,
//                      -room-interval-above 10 and -room-interval 200ms
//   PRESENCED_CONTROL  a URL whose /token?user=U&ttl=D mints a client token
//                      for U that expires after D (the app's backend)
//
// (node 20 needs --experimental-websocket for the global WebSocket the
// client uses; node 22 has it.)

import { test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import * as pkg from "@presenced/presence";
import { PresenceClient, idProblem } from "@presenced/presence";

const STEP = 20_000; // how long one expected change may take

test("the package exports the client by its name, and nothing else", async () => {
  assert.deepEqual(Object.keys(pkg).sort(), ["PresenceClient", "idProblem"]);
  assert.equal(typeof PresenceClient, "function");
  assert.ok(new PresenceClient({ userId: "a", url: "ws://127.0.0.1:1/v1/ws", storage: null }) instanceof EventTarget);
  assert.equal(idProblem("42"), "");
  assert.match(idProblem("a b"), /space/);

  const main = fileURLToPath(import.meta.resolve("@presenced/presence"));
  assert.match(main, /node_modules\/@presenced\/presence\/presence\.js$/);
  const dir = main.slice(0, -"presence.js".length);
  const timer = fileURLToPath(import.meta.resolve("@presenced/presence/presence-timer.js"));
  assert.equal(timer, dir + "presence-timer.js");
  assert.ok(existsSync(timer), "presence-timer.js is installed");
  const manifest = JSON.parse(readFileSync(dir + "package.json", "utf8"));
  assert.equal(manifest.name, "@presenced/presence");
  assert.equal(manifest.types, "./presence.d.ts");
  assert.equal(manifest.exports["."].types, "./presence.d.ts");
  assert.ok(existsSync(dir + manifest.types), "the declarations are installed");
  assert.deepEqual(manifest.dependencies ?? {}, {}, "no runtime dependencies");
  assert.deepEqual(manifest.engines, { node: ">=20" }, "the Node versions it runs on (20 and 21 with a WebSocket given)");
  // What the package does not export cannot be imported.
  await assert.rejects(import("@presenced/presence/presence.d.ts"), { code: "ERR_PACKAGE_PATH_NOT_EXPORTED" });
});

test("a client of the installed package sees a presence change on a real node, and renews its token unseen", async (t) => {
  const base = process.env.PRESENCED_URL;
  const control = process.env.PRESENCED_CONTROL;
  assert.ok(base && control, "PRESENCED_URL and PRESENCED_CONTROL are required");
  const url = base.replace(/^http/, "ws") + "/v1/ws";

  // alice (-dev: a bare user id) watches bob.
  const alice = new PresenceClient({ userId: "alice", url, storage: null });
  t.after(() => alice.close()); // also when an assertion fails: nothing keeps node running
  const seen = []; // bob's statuses as alice's client applied them
  alice.addEventListener("presence", (e) => {
    if (e.detail.user_id === "bob") seen.push(e.detail.status);
  });
  alice.start();
  alice.subscribe(["bob"]);
  await until(() => alice.state === "open" && seen.length > 0, "alice is welcomed and gets bob's snapshot");
  assert.deepEqual(seen, ["offline"], "bob is offline before he connects");

  // bob signs in with a token function whose tokens live 2 s: the server
  // closes his socket at each expiry (4003), and he comes back with a
  // fresh token as the same device.
  const bobLog = { tokens: 0, expiries: 0, devices: [] };
  const bob = new PresenceClient({
    url,
    storage: null,
    token: async () => {
      bobLog.tokens++;
      const res = await fetch(`${control}/token?user=bob&ttl=2s`);
      if (!res.ok) throw new Error(`token: HTTP ${res.status}`);
      return (await res.text()).trim();
    },
  });
  t.after(() => bob.close());
  bob.addEventListener("welcome", (e) => bobLog.devices.push(e.detail.device_id));
  bob.addEventListener("state", (e) => {
    if (e.detail.code === 4003) bobLog.expiries++;
  });
  bob.start();
  await until(() => seen.at(-1) === "online", "alice sees bob online");
  // The server announces bob before it answers his upgrade: his welcome
  // may arrive after alice heard of him.
  await until(() => bob.userId !== null, "bob's welcome");
  assert.equal(bob.userId, "bob", "the welcome names the token's user");
  bob.setStatus("busy", "in a meeting");
  await until(() => seen.at(-1) === "busy", "alice sees bob busy");
  assert.equal(alice.get("bob")?.status_text, "in a meeting");

  await until(() => bobLog.expiries >= 2 && bob.state === "open", "bob's token expires twice and he is back");
  assert.ok(bobLog.tokens >= 3, `a token per connection: ${JSON.stringify(bobLog)}`);
  assert.equal(new Set(bobLog.devices).size, 1, `one device throughout: ${JSON.stringify(bobLog)}`);
  assert.deepEqual(seen, ["offline", "online", "busy"], "alice saw nothing of the renewals");

  bob.bye();
  await until(() => seen.at(-1) === "offline", "alice sees bob offline after his bye");
  alice.close();
  assert.equal(alice.state, "closed");
});

test("rooms on a real node: who is here, and a dropped socket back within the close grace shows nothing", async (t) => {
  const url = process.env.PRESENCED_URL.replace(/^http/, "ws") + "/v1/ws";
  // -dev: a socket without a token may enter every room.
  const carol = new PresenceClient({ userId: "carol", url, storage: null });
  const dan = new PresenceClient({ userId: "dan", url, storage: null });
  t.after(() => (carol.close(), dan.close()));
  /** @type {Record<string, string[]>} each one's room events, as "event user" */
  const log = { carol: [], dan: [] };
  for (const [name, c] of [["carol", carol], ["dan", dan]]) {
    c.addEventListener("room", (e) => log[name].push(`room ${Object.keys(e.detail.members).sort()}`));
    c.addEventListener("roomchange", (e) => log[name].push(`${e.detail.event} ${e.detail.user_id}${e.detail.snapshot ? " snapshot" : ""}`));
    c.addEventListener("servererror", (e) => log[name].push(`error ${e.detail.code}`));
  }
  dan.start();
  dan.watchRoom("doc-42");
  await until(() => log.dan.length === 1, "dan's room message");
  carol.start();
  carol.join("doc-42");
  carol.watchRoom("doc-42");
  await until(() => log.dan.length === 2 && log.carol.length === 1, "dan sees carol join; carol's own room message");
  assert.deepEqual(log.dan, ["room ", "join carol"]);
  assert.deepEqual(log.carol, ["room carol"]);

  // carol's socket drops (closed under her client, not by it): she is back
  // within the close grace.
  const welcomes = carol.welcome;
  carol._ws.close();
  await until(() => carol.state === "open" && carol.welcome !== welcomes, "carol reconnects");
  dan.join("doc-42"); // after it, on dan's socket: a barrier for what carol's drop did
  // carol hears of dan's join live, or in the room message of her
  // re-watch if his join came first (nothing orders two sockets): once.
  const carolSaw = () => log.carol.map((e) => e.replace("join dan snapshot", "join dan"));
  await until(() => log.dan.at(-1) === "join dan" && carolSaw().at(-1) === "join dan", "both see dan join");
  assert.deepEqual(log.dan, ["room ", "join carol", "join dan"], "dan saw nothing of carol's drop");
  assert.deepEqual(carolSaw(), ["room carol", "join dan"], "carol's re-watch told her nothing else");
  assert.deepEqual(carol.getRoom("doc-42")?.members, { carol: "online", dan: "online" });

  carol.leave("doc-42");
  await until(() => log.dan.at(-1) === "leave carol", "dan sees carol leave");
});

test("a big room on a real node: into interval mode, roominterval events and no roomchange, a reconnect, and back", async (t) => {
  const url = process.env.PRESENCED_URL.replace(/^http/, "ws") + "/v1/ws";
  const room = "big-room";
  const watcher = new PresenceClient({ userId: "watcher", url, storage: null });
  /** @type {Map<string, PresenceClient>} */
  const members = new Map();
  t.after(() => {
    watcher.close();
    for (const c of members.values()) c.close();
  });
  /** @type {string[]} the watcher's room events, in order */
  const log = [];
  /** @type {string[]} every id the roominterval events named as joined, and as left */
  const joined = [];
  const left = [];
  watcher.addEventListener("room", (e) => log.push(`room ${e.detail.mode} ${e.detail.count}`));
  watcher.addEventListener("roomchange", (e) => log.push(`${e.detail.event} ${e.detail.user_id} ${e.detail.count}`));
  watcher.addEventListener("roominterval", (e) => {
    log.push("interval");
    joined.push(...e.detail.joined);
    left.push(...e.detail.left);
  });
  watcher.addEventListener("servererror", (e) => log.push(`error ${e.detail.code}`));
  /** @param {string} id */
  const member = (id) => {
    let c = members.get(id);
    if (!c) {
      c = new PresenceClient({ userId: id, url, storage: null });
      members.set(id, c);
      c.start();
    }
    return c;
  };
  const listed = () => Object.keys(watcher.getRoom(room)?.members ?? {}).sort().join(",");
  const ids = (/** @type {number[]} */ ...ns) => ns.map((n) => `m${String(n).padStart(2, "0")}`);

  watcher.start();
  watcher.watchRoom(room);
  await until(() => log.length === 1, "the watcher's room message");
  for (const [i, id] of ids(0, 1, 2, 3, 4, 5, 6, 7, 8, 9).entries()) {
    member(id).join(room);
    await until(() => log.at(-1) === `join ${id} ${i + 1}`, `${id}'s join`);
  }
  // The eleventh member: above -room-interval-above 10, a room message in interval mode.
  member("m10").join(room);
  await until(() => log.at(-1) === "room interval 11", "the switch into interval mode");
  assert.equal(watcher.getRoom(room)?.mode, "interval");
  assert.equal(listed(), ids(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10).join(","));

  // Joins and leaves come in roominterval events; a change of status not at all.
  const mark = log.length;
  member("m05").setStatus("busy");
  member("m11").join(room);
  member("m00").leave(room);
  await until(() => listed() === ids(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11).join(","), "the intervals of m11's join and m00's leave");
  assert.deepEqual([joined.sort(), left.sort()], [["m11"], ["m00"]]);
  assert.deepEqual(watcher.getRoom(room)?.members.m11, null, "an interval names ids, not statuses");

  // The watcher's socket drops; m12 joins meanwhile: told once, live or by the fresh room message.
  const welcome = watcher.welcome;
  watcher._ws.close();
  member("m12").join(room);
  await until(() => watcher.state === "open" && watcher.welcome !== welcome, "the watcher reconnects");
  await until(() => joined.includes("m12"), "m12's join");
  assert.deepEqual(joined.sort(), ["m11", "m12"]);
  assert.equal(watcher.getRoom(room)?.count, 12);

  // Below nine tenths of 10: events mode again, each change told.
  for (const id of ids(1, 2, 3, 4)) member(id).leave(room);
  await until(() => log.at(-1) === "room events 8", "the switch back to events mode");
  assert.ok(
    log.slice(mark).every((e) => e === "interval" || e.startsWith("room ")),
    `no roomchange in interval mode: ${log.slice(mark)}`,
  );
  assert.equal(watcher.getRoom(room)?.members.m05, "busy", "the room message of events mode has every status");
  member("m01").join(room);
  await until(() => log.at(-1) === "join m01 9", "m01's join, told as a roomchange");
});

test("a re-subscribe after a dropped socket is answered with what changed only", async (t) => {
  const url = process.env.PRESENCED_URL.replace(/^http/, "ws") + "/v1/ws";
  /** @type {any[]} the snapshots the watcher's sockets received */
  const snapshots = [];
  // The watcher's WebSocket, which also notes each snapshot it receives.
  class Spy extends WebSocket {
    /** @param {string | URL} u @param {string | string[]} [p] */
    constructor(u, p) {
      super(u, p);
      this.addEventListener("message", (e) => {
        const m = JSON.parse(String(e.data));
        if (m.type === "snapshot") snapshots.push(m);
      });
    }
  }
  const xa = new PresenceClient({ userId: "xa", url, storage: null });
  const xb = new PresenceClient({ userId: "xb", url, storage: null });
  const w = new PresenceClient({ userId: "xw", url, storage: null, WebSocket: Spy });
  t.after(() => (xa.close(), xb.close(), w.close()));
  /** @type {string[]} */
  const seen = [];
  w.addEventListener("presence", (e) => seen.push(`${e.detail.user_id} ${e.detail.status}`));
  xa.start();
  xb.start();
  await until(() => xa.state === "open" && xb.state === "open", "xa and xb connected");
  w.subscribe(["xa", "xb"]);
  w.start();
  await until(() => w.get("xa")?.status === "online" && w.get("xb")?.status === "online", "the watcher sees both online");
  xb.setStatus("busy");
  await until(() => w.get("xb")?.status === "busy", "the watcher sees xb busy");
  const before = seen.length;

  w._ws.close(); // dropped under the client: it reconnects and subscribes again
  await until(() => snapshots.length === 2, "the re-subscribe's snapshot");
  assert.deepEqual(snapshots[1].users, {}, "neither changed while away: no user in the snapshot");
  assert.equal(snapshots[1].unchanged, 2);
  assert.equal(seen.length, before, "nothing shown again");
  xa.setStatus("away");
  await until(() => w.get("xa")?.status === "away", "a change after the reconnect is shown");
});


// until polls cond until it holds, or fails after STEP naming what it waited for.
async function until(cond, what) {
  const deadline = Date.now() + STEP;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`waited ${STEP} ms for: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

// The installed @presenced/presence in a runtime without a global
// WebSocket (Node 20 and 21 without --experimental-websocket; on later
// Node this file removes the global first). e2e/npm_test.go copies it
// beside the install and runs it, without the flag, with
//
//   PRESENCED_URL  http://host:port of a presenced started with -dev
//   WS_MODULE      the file of the ws package's ESM entry (wrapper.mjs)

import { test } from "node:test";
import assert from "node:assert/strict";
import { pathToFileURL } from "node:url";
import { PresenceClient } from "@presenced/presence";

delete globalThis.WebSocket;
const url = process.env.PRESENCED_URL.replace(/^http/, "ws") + "/v1/ws";

test("without a WebSocket the constructor says so, and what to do", () => {
  assert.equal(typeof globalThis.WebSocket, "undefined");
  assert.throws(() => new PresenceClient({ userId: "nows", url, storage: null }), {
    name: "TypeError",
    message: /this runtime has no WebSocket: pass one .*--experimental-websocket/,
  });
  assert.throws(() => new PresenceClient({ userId: "nows", url, storage: null, WebSocket: "ws" }), {
    name: "TypeError",
    message: /the WebSocket option must be a WebSocket class/,
  });
});

test("with the ws package's WebSocket it connects and is welcomed", async () => {
  const { WebSocket } = await import(pathToFileURL(process.env.WS_MODULE).href);
  const c = new PresenceClient({ userId: "nows", url, storage: null, timerWorkerURL: null, WebSocket });
  try {
    const welcome = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("no welcome within 20 s")), 20_000);
      c.addEventListener("welcome", (ev) => {
        clearTimeout(timer);
        resolve(/** @type {CustomEvent} */ (ev).detail);
      });
      c.start();
    });
    assert.equal(welcome.user_id, "nows");
    assert.equal(c.state, "open");
  } finally {
    c.close();
  }
});

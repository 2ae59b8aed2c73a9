// presence.js — the browser client of presenced. No dependencies, nothing
// from the network but the service itself; an ES module:
//
//   import { PresenceClient } from "/static/presence.js"; // or "@presenced/presence" (npm)
//   const client = new PresenceClient({ userId: "42" });      // -dev only
//   // or: new PresenceClient({ token: async () => (await fetch("/my-backend/presence-token")).text() })
//   // or: new PresenceClient({ token: "<HS256 token from your backend>" })
//   client.addEventListener("presence", (e) => render(e.detail));
//   client.start();
//   client.subscribe(["7", "9"]);
//   client.setStatus("busy", "in a meeting");
//   client.join("doc-42"); client.watchRoom("doc-42"); // who is here
//   client.addEventListener("room", (e) => drawRoom(e.detail));          // the room, to replace
//   client.addEventListener("roomchange", (e) => drawChange(e.detail));  // a join, leave or status
//   client.addEventListener("roominterval", (e) => drawBig(e.detail));   // a big room's joins and leaves
//   signOutButton.onclick = () => client.bye();
//
// What it does (the wire contract is docs/protocol.md):
//
// - Holds one WebSocket to /v1/ws of the page's origin (or `url`). The
//   device id the server hands out in `welcome` is kept in sessionStorage —
//   one device per tab — and sent on every reconnect, so a reconnect or a
//   reload within the close grace (`close_grace_ms` of the welcome, 5 s by
//   default) is the same device and watchers see nothing.
// - Heartbeats every `heartbeat_interval_ms` of the welcome, ±10% jitter so
//   a crowd of tabs does not beat in step.
// - Activity: keyboard, pointer, wheel, touch and focus mark the person
//   active. A heartbeat says `"active": false` while the page is hidden or
//   after `inactiveAfterMs` (default 60 s) without input; the server turns
//   the user `away` after its idle-after without activity. Coming back
//   (input after a quiet spell, the page shown again) beats at once.
// - Reconnects after any drop with exponential backoff (0.5 s doubling to
//   30 s) and jitter (each wait is 50–100% of the step); the `online` event
//   of the window retries at once. After every reconnect it subscribes
//   again to everything subscribed and re-sends a status set while offline.
// - Tokens expire: the server closes a socket when its token's exp passes
//   (close code 4003) and keeps the device for its close grace. With
//   `token` a function (sync or async) the client asks it for a token
//   before every connection, so it comes back with a fresh one as the same
//   device and watchers see nothing; with a fixed token string it stops
//   (state "closed", code 4003), as the same token would be refused.
// - Applies a `presence` message, and each user of a `snapshot`, only if
//   its version is above the last one applied for that user; duplicates and
//   stale replays are dropped.
// - Rooms (docs/protocol.md "Rooms"; the token's `rooms` claim must allow
//   them): the rooms joined and watched outlive connections. After every
//   reconnect the client sends the leaves made while away, then joins and
//   watches again, paced below the server's message rate; within the close
//   grace nobody sees anything. It holds each watched room as last seen:
//   the fresh `room` message of a re-watch (or of a resync) replaces it,
//   and only what differs is told, as `roomchange` events with `snapshot:
//   true` — a member who left meanwhile is a leave then, and nothing is
//   told when nothing changed.
// - Big rooms: a room of more members than the server's
//   -room-interval-above (1,000) is in interval mode. Its `room` message
//   (mode "interval") lists the first 100 members, and instead of a
//   `roomchange` per join and leave the client tells one `roominterval`
//   per interval (-room-interval, 5 s) in which the room changed: the ids
//   that joined and left, no status. The view of such a room (getRoom) is
//   that first page plus the ids joined since (status null: not sent),
//   minus those left: some of its members, not all; `count` is the one
//   number for the whole room. Each switch of mode is a `room` event; after
//   a reconnect in interval mode what differs is told as one `roominterval`
//   with `snapshot: true`.
// - bye() is the explicit sign-out: the device ends at once (over the socket,
//   or with POST /v1/bye when the socket is down) and the client stops.
//
// Closing the tab deliberately sends NO bye. A browser cannot tell a closed
// tab from a reload or a navigation (pagehide fires for all three), and a
// bye on reload would show every watcher a false offline→online flap. So a
// closed tab is a departure detected by absence: the socket drops, beats
// stop, and the server reports the user offline when the close grace after
// the socket's close ends (default 5 s; a socket that just goes silent
// keeps its device for the ttl, 30 s). An app that wants the immediate
// goodbye on its own pages can call bye() in its own pagehide handler.
//
// Events (an EventTarget; `event.detail` carries the data):
//   "presence"  {user_id, status, last_seen, status_text, version} — applied
//               state of a watched user (from a snapshot or a live change);
//               status is null when that user hides it from this viewer
//               (live too: a contact list or setting of theirs that took
//               this viewer's sight away); the user's own status is the
//               true one, "invisible" included
//   "welcome"   the welcome message (user_id, device_id, intervals)
//   "state"     {state: "connecting"|"open"|"waiting"|"closed", retryInMs,
//               code} — code: the close code of the socket that ended, when
//               one did (4003: the token expired)
//   "servererror" {code, message, request, room} — an `error` message of
//               the server; a refused subscribe (too_many_subscriptions)
//               leaves its ids in `subscriptions`, so unsubscribe() them to
//               stay under the cap. `room` names the room of a refused
//               join, leave, watch or unwatch and `request` the message
//               refused ("join", "leave", "watch_room", "unwatch_room";
//               both absent for other errors), and the client has acted on
//               exactly that message: one refused with a code a retry can
//               cure (unavailable, rate_limited, device_not_alive) is sent
//               again after a backoff (0.5 s doubling to 30 s, jittered)
//               while the app still wants what it asked for (its own
//               join/leave/watchRoom/unwatchRoom of the room supersedes
//               the retry) and the socket lasts — the next socket joins
//               and watches again, and sends a leave still due; a join or
//               watch refused for good (room_not_allowed, too_many_rooms,
//               too_many_watched_rooms, rooms_unavailable, internal, …) is
//               taken out of `rooms` or `watchedRooms` — join() or
//               watchRoom() it again to retry. A server that names
//               only the room (no `request`): a retry then sends the
//               room's join and watch still wanted, and a code both may
//               get drops both, the watch only if its "room" event had not
//               come yet
//   "room"      {room, mode, count, members, partial, next, version} — a
//               watched room as first seen (once per watchRoom, and again
//               when it switches mode): replace what you hold; members maps
//               user id → status (null: hidden); mode "events" or
//               "interval"; next: the cursor of the members not listed
//   "roomchange" {room, user_id, event, status, count, version, snapshot}
//               — event "join", "leave" or "status"; snapshot: found by
//               comparing a fresh room message with the room as held
//   "roominterval" {room, count, joined, left, more_joined, more_left,
//               version, snapshot} — a big room's net joins and leaves
//               since the last (ids, at most 256 of each, the rest counted)
//
// Browsers throttle the timers of background tabs (Chrome: one wake-up a
// minute after some minutes hidden, longer than the ttl). The heartbeat and
// retry timers therefore also run in a small worker, presence-timer.js
// beside this file; without it (or where the browser freezes the whole tab)
// a long-hidden tab may read offline until it is shown again, when it beats
// at once.
//
// The types below (JSDoc) are checked by tsc (--checkJs --strict), and
// presence.d.ts, the declarations of the npm package @presenced/presence,
// is checked against them (e2e/npm_test.go).

/** @typedef {"online" | "away" | "busy" | "invisible"} ManualStatus a status one sets */
/** @typedef {"online" | "away" | "busy" | "offline" | "invisible"} Status a status one sees */
/** @typedef {"connecting" | "open" | "waiting" | "closed"} ConnectionState */
/** @typedef {string | (() => string | Promise<string>)} TokenSource */

/**
 * @typedef {object} PresenceView the applied state of a watched user
 * @property {string} user_id
 * @property {Status | null} status null: hidden from this viewer
 * @property {string | null} last_seen RFC 3339, or null when hidden or never seen
 * @property {string | null} status_text
 * @property {number | null} version grows with every change of the user;
 *   null when the user has none yet or the status is hidden
 */

/**
 * @typedef {object} Welcome the server's first message on a connection
 * @property {"welcome"} type
 * @property {string} user_id
 * @property {string} device_id
 * @property {number} heartbeat_interval_ms
 * @property {number} ttl_ms
 * @property {number} [close_grace_ms]
 * @property {boolean} [subscribe_known] the server takes the versions a
 *   re-subscribe holds, and leaves out of its snapshot who is still at one
 */

/**
 * @typedef {object} StateDetail
 * @property {ConnectionState} state
 * @property {number} [retryInMs] with "waiting": the wait before the next attempt
 * @property {number} [code] the close code of the socket that ended, when one did
 */

/**
 * @typedef {object} ServerErrorDetail
 * @property {string} code
 * @property {string} message
 * @property {string} [room] the room of a refused join, leave, watch or
 *   unwatch; absent for other errors
 * @property {RoomMessage["type"]} [request] the message refused, with room
 *   (absent from a service older than the field)
 */

/**
 * @typedef {"events" | "interval"} RoomMode how a room's changes come:
 *   "roomchange" events, or (a big room) "roominterval" events
 */

/**
 * @typedef {object} RoomView a watched room as the client holds it
 * @property {string} room
 * @property {RoomMode} mode of the last room message
 * @property {number} count all the room's members, listed or not
 * @property {Record<string, Status | null>} members the members listed,
 *   user id → status as this viewer may see it (null: hidden, or added by
 *   a "roominterval", which carries ids only)
 * @property {boolean} partial the room has more members than listed
 *   (next is set); its watchers get joins and leaves, no change of status
 * @property {string | null} next the cursor of the members after those
 *   listed (GET /v1/rooms/{room}?after=); null when all were listed
 * @property {number} version grows with every join and leave of the room
 */

/** @typedef {"join" | "leave" | "status"} RoomEventKind */

/**
 * @typedef {object} RoomChangeDetail one change of a watched room
 * @property {string} room
 * @property {string} user_id
 * @property {RoomEventKind} event
 * @property {Status | null} status after the change; null for a leave or hidden
 * @property {number} count the room's members after the change
 * @property {number} version the room's version after the change
 * @property {boolean} snapshot found by comparing a fresh room message
 *   (after a reconnect) with the room as held, not sent live
 */

/**
 * @typedef {object} RoomIntervalDetail what changed in a big room (interval
 *   mode) since the last: the net joins and leaves
 * @property {string} room
 * @property {number} count the room's members now
 * @property {string[]} joined users who joined, sorted, at most 256
 * @property {string[]} left users who left, sorted, at most 256
 * @property {number} more_joined joined beyond those listed
 * @property {number} more_left left beyond those listed
 * @property {number} version the room's version now
 * @property {boolean} snapshot found by comparing a fresh room message
 *   (after a reconnect) with the room as held, not sent live
 */

/**
 * @typedef {object} PresenceClientEventMap the events of a PresenceClient
 * @property {CustomEvent<PresenceView>} presence the applied state of a watched user
 * @property {CustomEvent<Welcome>} welcome a connection is open
 * @property {CustomEvent<StateDetail>} state the connection's state changed
 * @property {CustomEvent<ServerErrorDetail>} servererror an `error` message of the server
 * @property {CustomEvent<RoomView>} room a watched room as first seen: replace what you hold
 * @property {CustomEvent<RoomChangeDetail>} roomchange a change of a watched room
 * @property {CustomEvent<RoomIntervalDetail>} roominterval a big room's joins and leaves
 */

/**
 * @typedef {object} PresenceClientOptions
 * @property {string} [userId] development mode (-dev): act as this user
 * @property {TokenSource} [token] a client token, or a function that returns
 *   a fresh one (asked before every connection)
 * @property {string} [url] WebSocket URL; default /v1/ws of the page
 * @property {number} [inactiveAfterMs] no input this long → not active
 * @property {Storage | null} [storage] where the device id lives
 * @property {string | null} [timerWorkerURL] presence-timer.js; null: none
 * @property {WebSocketConstructor} [WebSocket] the WebSocket implementation;
 *   default the runtime's global one
 */

/**
 * @typedef {new (url: string) => WebSocket} WebSocketConstructor a class
 *   with the standard WebSocket interface (a browser's, Node 22's, or the
 *   `ws` package's)
 */

/**
 * @typedef {{type: "heartbeat", active?: false}
 *   | {type: "set_status", status: ManualStatus, text?: string}
 *   | {type: "subscribe", user_ids: string[], known?: Record<string, number>}
 *   | {type: "unsubscribe", user_ids: string[]}
 *   | RoomMessage} ClientMessage
 */

/** @typedef {{type: "join" | "leave" | "watch_room" | "unwatch_room", room: string}} RoomMessage */

/**
 * @typedef {object} RoomRetry the retry of a refused room message: of a
 *   room's join or leave, or of its watch or unwatch
 * @property {RoomMessage["type"]} type the message to send again: the last one refused
 * @property {number} attempt retries of this episode so far
 * @property {number} sent when (ms) the last retry went out; 0: none yet
 * @property {boolean} beat send a heartbeat first (device_not_alive)
 * @property {(() => void) | null} cancel the planned retry's; null: none planned
 */

/**
 * @typedef {object} HeldRoom a watched room and whether its first room
 *   message has come
 * @property {boolean} have
 * @property {RoomView} view
 */

/** @type {ReadonlySet<string>} */
const STATUSES = new Set(["online", "away", "busy", "invisible"]);
const TOKEN_EXPIRED = 4003; // the close code of a socket whose token expired
// WebSocket readyState values (the standard's; the same in every
// implementation, unlike where each keeps them).
const WS_CONNECTING = 0;
const WS_OPEN = 1;
const INPUT_EVENTS = ["keydown", "pointerdown", "pointermove", "wheel", "touchstart", "focus"];
// Room messages count against the server's messages per connection (20 a
// second, bursts of 40) with heartbeats and subscribes: the client keeps
// them well below.
const ROOM_EVERY_MS = 67;
const ROOM_BURST = 24;
// The codes of a refused join or watch that a retry can cure
// (docs/protocol.md "Rooms"); the client retries those after a backoff
// like a reconnect's, and drops the room on any other.
const ROOM_RETRYABLE = new Set(["unavailable", "rate_limited", "device_not_alive"]);
const ROOM_RETRY_MIN_MS = 500;
const ROOM_RETRY_MAX_MS = 30_000;

/**
 * What a retry is about: a room's membership (join, leave) or its watch
 * (watch_room, unwatch_room); a room has one retry of each at most.
 * @param {RoomMessage["type"]} type
 * @param {string} room
 */
function retryKey(type, room) {
  return (type === "watch_room" || type === "unwatch_room" ? "w " : "m ") + room;
}

export class PresenceClient extends EventTarget {
  /**
   * @param {PresenceClientOptions} opts
   *   userId: development mode (-dev): act as this user;
   *   token: a client token (HS256, `sub` = user id), or a function (sync
   *   or async) that returns a fresh one (asked before every connection:
   *   how an expired token is renewed);
   *   url: WebSocket URL, default /v1/ws of the page;
   *   inactiveAfterMs: no input this long → not active (60 s);
   *   storage: where the device id lives (sessionStorage);
   *   timerWorkerURL: presence-timer.js (default: beside this file); null:
   *   the page's timers only (see later());
   *   WebSocket: the WebSocket class to connect with (default the
   *   runtime's global one; Node before 22 has none: pass the `ws`
   *   package's, or run Node with --experimental-websocket)
   */
  constructor(opts = {}) {
    super();
    if (!opts.userId && !opts.token) throw new Error("PresenceClient: userId or token is required");
    const WS = opts.WebSocket ?? globalThis.WebSocket;
    if (typeof WS !== "function") {
      throw new TypeError(
        opts.WebSocket !== undefined
          ? "PresenceClient: the WebSocket option must be a WebSocket class"
          : "PresenceClient: this runtime has no WebSocket: pass one (new PresenceClient({ WebSocket })," +
              " e.g. the ws package's), or on Node 20 or 21 run node --experimental-websocket (Node 22 and later have one)",
      );
    }
    /** @private @type {WebSocketConstructor} */
    this._WebSocket = WS;
    if (opts.token && typeof opts.token !== "string" && typeof opts.token !== "function") {
      throw new TypeError("PresenceClient: token must be a string or a function that returns one");
    }
    /** @type {string | null} the user: opts.userId, then the welcome's */
    this.userId = opts.userId || null;
    /** @private @type {(() => string | Promise<string>) | null} */
    this._tokenFn = typeof opts.token === "function" ? opts.token : null;
    /** @type {string | null} the last token used */
    this.token = typeof opts.token === "string" && opts.token !== "" ? opts.token : null;
    /** @private counts connection attempts and stops, so a stale token fetch opens nothing */
    this._gen = 0;
    /** @type {string} */
    this.url = opts.url || defaultURL();
    /** @type {number} */
    this.inactiveAfterMs = opts.inactiveAfterMs ?? 60_000;
    /** @type {Storage | null} */
    // null is a choice (nowhere: a new device per client), not a default.
    this.storage = opts.storage === undefined ? safeSessionStorage() : opts.storage;
    /** @type {string | null} */
    this.deviceId = this._load() || null;
    /** @type {Set<string>} */
    this.subscriptions = new Set();
    /** @type {Map<string, number | null>} user id → last applied version */
    this.versions = new Map();
    /** @type {Map<string, PresenceView>} user id → last applied view */
    this.views = new Map();
    /** @type {Set<string>} the rooms this device is in (or is to be, once connected) */
    this.rooms = new Set();
    /** @type {Set<string>} the rooms watched */
    this.watchedRooms = new Set();
    /** @private @type {Set<string>} rooms left whose leave is still to go out */
    this._leaving = new Set();
    /** @private @type {Map<string, HeldRoom>} watched rooms as last seen */
    this._held = new Map();
    /** @private @type {RoomMessage[]} room messages waiting for their turn */
    this._roomOut = [];
    /** @private the time (ms) the pacing of room messages is back to full */
    this._roomTat = 0;
    /** @private */
    this._cancelRoomPump = noop;
    /** @private @type {Map<string, RoomRetry>} refused room messages to send again on this socket, by retryKey */
    this._roomRetries = new Map();
    /** @type {Welcome | null} */
    this.welcome = null;
    /** @type {ConnectionState} */
    this.state = "closed";
    /** @private @type {WebSocket | null} */
    this._ws = null;
    /** @private */
    this._stopped = true;
    /** @private */
    this._attempt = 0;
    /** @private */
    this._cancelBeat = noop;
    /** @private */
    this._cancelRetry = noop;
    /** @private @type {string | null} */
    this._timerURL = opts.timerWorkerURL === undefined ? defaultTimerURL() : opts.timerWorkerURL;
    /** @private @type {ClientMessage | null} a set_status to send once connected */
    this._pendingStatus = null;
    /** @private */
    this._lastInput = Date.now();
    /** @private */
    this._lastSend = 0;
    /** @private */
    this._reportedActive = true;
    /** @private */
    this._onInput = this._onInput.bind(this);
    /** @private */
    this._onVisibility = this._onVisibility.bind(this);
    /** @private */
    this._onOnline = () => {
      if (this.state === "waiting") this._connectNow();
    };
  }

  /**
   * Connects and keeps connected until bye() or close().
   * @returns {void}
   */
  start() {
    if (!this._stopped) return;
    this._stopped = false;
    if (typeof window !== "undefined") {
      for (const t of INPUT_EVENTS) window.addEventListener(t, this._onInput, { passive: true, capture: true });
      window.addEventListener("online", this._onOnline);
    }
    if (typeof document !== "undefined") document.addEventListener("visibilitychange", this._onVisibility);
    this._connect();
  }

  /**
   * Watches users; their current state arrives as "presence" events. Throws
   * on an id the server would refuse (see idProblem): one bad id would make
   * the server refuse the whole list again on every reconnect.
   * @param {readonly string[]} ids
   * @returns {void}
   */
  subscribe(ids) {
    for (const id of ids) {
      const problem = idProblem(id);
      if (problem) throw new TypeError(`PresenceClient: user id ${JSON.stringify(id)}: ${problem}`);
    }
    const fresh = [...new Set(ids)].filter((id) => id && !this.subscriptions.has(id));
    if (fresh.length === 0) return;
    for (const id of fresh) this.subscriptions.add(id);
    this._send({ type: "subscribe", user_ids: fresh });
  }

  /**
   * Stops watching users.
   * @param {readonly string[]} ids
   * @returns {void}
   */
  unsubscribe(ids) {
    const gone = [...new Set(ids)].filter((id) => this.subscriptions.delete(id));
    for (const id of gone) this.views.delete(id);
    if (gone.length > 0) this._send({ type: "unsubscribe", user_ids: gone });
  }

  /**
   * Sets the manual status: "online" (clears), "away", "busy" or
   * "invisible"; text is optional (≤ 140 characters), omitted = cleared.
   * Sent now, or as soon as the socket is back.
   * @param {ManualStatus} status
   * @param {string} [text]
   * @returns {void}
   */
  setStatus(status, text) {
    if (!STATUSES.has(status)) throw new Error(`PresenceClient: unknown status ${JSON.stringify(status)}`);
    /** @type {ClientMessage} */
    const msg = { type: "set_status", status };
    if (text) msg.text = String(text);
    this._pendingStatus = msg;
    if (this._isOpen()) {
      this._send(msg);
      this._pendingStatus = null;
    }
  }

  /**
   * Explicit sign-out: ends this device at once (watchers see the user
   * offline now, if no other device is alive) and stops the client.
   * @returns {void}
   */
  bye() {
    const ws = this._ws;
    const wasOpen = this._isOpen();
    const device = this.deviceId;
    this._stop();
    if (wasOpen && ws) {
      ws.send(JSON.stringify({ type: "bye" })); // the server closes with 1000
      setTimeout(() => ws.close(1000), 2000);
    } else if (device) {
      // The socket is down but the device may still be alive: end it over HTTP.
      const url = httpURL(this.url, "/v1/bye");
      const userId = this.userId;
      /** @param {string | null} token */
      const send = (token) => {
        /** @type {Record<string, string>} */
        const headers = { "Content-Type": "application/json" };
        /** @type {Record<string, string | null>} */
        const body = { device_id: device };
        if (token) headers.Authorization = `Bearer ${token}`;
        else body.user_id = userId;
        return fetch(url, { method: "POST", headers, body: JSON.stringify(body), keepalive: true });
      };
      if (this._tokenFn) {
        // The last token may have expired: ask for a fresh one.
        Promise.resolve()
          .then(this._tokenFn)
          .then(send)
          .catch(() => {});
      } else {
        send(this.token).catch(() => {}); // at once: the page may be going away
      }
    }
    this._forget();
  }

  /**
   * Stops without a goodbye: the device stays alive for its close grace,
   * exactly like a dropped connection.
   * @returns {void}
   */
  close() {
    const ws = this._ws;
    this._stop();
    if (ws) ws.close(1000);
  }

  /**
   * The last applied view of a watched user, or undefined.
   * @param {string} id
   * @returns {PresenceView | undefined}
   */
  get(id) {
    return this.views.get(id);
  }

  // --- rooms ---

  /**
   * Puts this device in a room (its watchers see the user join). Kept
   * across reconnects: the client joins again on every connection. Joining
   * a room joined already does nothing. Throws on a room id the server
   * would refuse (see idProblem).
   * @param {string} room
   * @returns {void}
   */
  join(room) {
    checkRoom(room);
    if (this.rooms.has(room)) return;
    this.rooms.add(room);
    this._leaving.delete(room);
    this._supersedeRoomRetry("join", room);
    this._queueRoom({ type: "join", room });
  }

  /**
   * Takes this device out of a room; leaving a room not joined does
   * nothing. While disconnected the leave goes out on the next connection
   * (the server keeps the device in its rooms through the close grace).
   * @param {string} room
   * @returns {void}
   */
  leave(room) {
    checkRoom(room);
    if (!this.rooms.delete(room)) return;
    this._leaving.add(room);
    this._supersedeRoomRetry("leave", room);
    this._queueRoom({ type: "leave", room });
  }

  /**
   * Watches a room: a "room" event follows, then a "roomchange" event for
   * each join, leave and change of status — or, while the room is big
   * (mode "interval"), a "roominterval" event per interval with its joins
   * and leaves. Kept across reconnects (see
   * the top of this file). Watching a room watched already does nothing.
   * @param {string} room
   * @returns {void}
   */
  watchRoom(room) {
    checkRoom(room);
    if (this.watchedRooms.has(room)) return;
    this.watchedRooms.add(room);
    /** @type {RoomView} */
    const view = { room, mode: "events", count: 0, members: {}, partial: false, next: null, version: 0 };
    this._held.set(room, { have: false, view });
    this._supersedeRoomRetry("watch_room", room);
    this._queueRoom({ type: "watch_room", room });
  }

  /**
   * Stops watching a room; no event about it follows.
   * @param {string} room
   * @returns {void}
   */
  unwatchRoom(room) {
    checkRoom(room);
    if (!this.watchedRooms.delete(room)) return;
    this._held.delete(room);
    this._supersedeRoomRetry("unwatch_room", room);
    this._queueRoom({ type: "unwatch_room", room });
  }

  /**
   * A watched room as the client holds it now (a copy), or undefined before
   * its first "room" event.
   * @param {string} room
   * @returns {RoomView | undefined}
   */
  getRoom(room) {
    const held = this._held.get(room);
    return held?.have ? { ...held.view, members: { ...held.view.members } } : undefined;
  }

  // --- connection ---

  /** @private */
  async _connect() {
    const gen = ++this._gen;
    this._setState("connecting");
    if (this._tokenFn) {
      let token;
      try {
        token = await this._tokenFn();
      } catch {
        token = null;
      }
      if (this._stopped || gen !== this._gen) return; // stopped or superseded meanwhile
      if (typeof token !== "string" || token === "") {
        this._scheduleReconnect();
        return;
      }
      this.token = token;
    }
    const u = new URL(this.url);
    if (this.token) u.searchParams.set("token", this.token);
    else u.searchParams.set("user_id", this.userId ?? "");
    if (this.deviceId) u.searchParams.set("device_id", this.deviceId);
    let ws;
    try {
      ws = new this._WebSocket(u.toString());
    } catch (err) {
      this._scheduleReconnect();
      return;
    }
    this._ws = ws;
    ws.onmessage = (ev) => {
      if (this._ws !== ws) return;
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch {
        return;
      }
      this._handle(msg);
    };
    ws.onclose = (ev) => {
      if (this._ws !== ws) return;
      this._ws = null;
      this._cancelBeat();
      this._cancelRoomPump();
      this._cancelRoomRetries(); // the next socket joins and watches everything again
      if (this._stopped) return;
      // 1000 after our bye is handled by _stop; anything else is a drop:
      // the server keeps the device alive for its close grace, we come back
      // — after a token expiry with a fresh token, which only a token
      // function can give.
      if (ev.code === TOKEN_EXPIRED && !this._tokenFn) {
        this._stop({ code: ev.code });
        return;
      }
      this._scheduleReconnect(ev.code);
    };
    ws.onerror = () => {}; // a close follows
  }

  /**
   * @private
   * @param {any} msg a message of the server, parsed
   */
  _handle(msg) {
    switch (msg.type) {
      case "welcome":
        this.welcome = msg;
        this._attempt = 0;
        if (msg.device_id && msg.device_id !== this.deviceId) {
          this.deviceId = msg.device_id;
          this._save(msg.device_id);
        }
        if (msg.user_id) this.userId = msg.user_id;
        this._lastSend = Date.now(); // connecting counts as a heartbeat
        this._reportedActive = true;
        this._setState("open");
        if (this.subscriptions.size > 0) {
          const ids = [...this.subscriptions];
          /** @type {{type: "subscribe", user_ids: string[], known?: Record<string, number>}} */
          const sub = { type: "subscribe", user_ids: ids };
          if (msg.subscribe_known === true) {
            // The versions held: the snapshot leaves out who is still at one.
            /** @type {Record<string, number>} */
            const known = {};
            for (const id of ids) {
              const v = this.versions.get(id);
              if (typeof v === "number" && v > 0) known[id] = v;
            }
            if (Object.keys(known).length > 0) sub.known = known;
          }
          this._send(sub);
        }
        // A watch ends with its connection; the device's rooms do not
        // (within the close grace), so only what is due goes out again.
        this._roomOut = [
          ...[...this._leaving].map((room) => /** @type {RoomMessage} */ ({ type: "leave", room })),
          ...[...this.rooms].map((room) => /** @type {RoomMessage} */ ({ type: "join", room })),
          ...[...this.watchedRooms].map((room) => /** @type {RoomMessage} */ ({ type: "watch_room", room })),
        ];
        this._pumpRooms();
        if (this._pendingStatus) {
          this._send(this._pendingStatus);
          this._pendingStatus = null;
        }
        this._scheduleBeat();
        this._emit("welcome", msg);
        break;
      case "snapshot":
        for (const [id, view] of Object.entries(msg.users || {})) this._apply({ ...view, user_id: id });
        break;
      case "presence":
        this._apply(msg);
        break;
      case "room":
        this._applyRoom(msg);
        break;
      case "room_change":
        this._applyRoomChange(msg);
        break;
      case "room_interval":
        this._applyRoomInterval(msg);
        break;
      case "error": {
        /** @type {ServerErrorDetail} */
        const detail = { code: msg.code, message: msg.message };
        if (typeof msg.room === "string" && msg.room !== "") {
          detail.room = msg.room;
          if (typeof msg.request === "string") detail.request = msg.request;
          this._roomRefused(msg.code, detail.request, msg.room);
        }
        this._emit("servererror", detail);
        break;
      }
    }
  }

  /**
   * @private
   * @param {{user_id: string, version: number | null, status?: Status | null, last_seen?: string | null, status_text?: string | null}} view
   */
  _apply(view) {
    const id = view.user_id;
    if (!this.subscriptions.has(id)) return;
    const last = this.versions.get(id);
    // A null version (none yet, or hidden in a snapshot) counts as 0.
    if (last !== undefined && !((view.version ?? 0) > (last ?? 0))) return; // duplicate or stale
    this.versions.set(id, view.version);
    /** @type {PresenceView} */
    const v = {
      user_id: id,
      status: view.status ?? null,
      last_seen: view.last_seen ?? null,
      status_text: view.status_text ?? null,
      version: view.version,
    };
    this.views.set(id, v);
    this._emit("presence", v);
  }

  /**
   * A room message: the first of a watch, one in the other mode, or one of
   * a room listed in part (before or now) is told as it is; a later one (a
   * re-watch, a resync) replaces the view, told as what differs.
   * @private
   * @param {any} msg
   */
  _applyRoom(msg) {
    const held = this._held.get(msg.room);
    if (!held) return; // not watched (any more)
    /** @type {Record<string, Status | null>} */
    const members = {};
    for (const [id, s] of Object.entries(msg.members || {})) members[id] = /** @type {Status | null} */ (s ?? null);
    const next = typeof msg.next === "string" ? msg.next : null;
    /** @type {RoomView} */
    const view = {
      room: msg.room,
      mode: msg.mode === "interval" ? "interval" : "events",
      count: msg.count ?? 0,
      members,
      partial: next !== null,
      next,
      version: msg.version ?? 0,
    };
    const old = held.view;
    const first = !held.have;
    held.have = true;
    held.view = view;
    if (first || old.mode !== view.mode || old.partial || view.partial) {
      this._emit("room", { ...view, members: { ...members } });
      return;
    }
    if (view.mode === "interval") {
      // As the server tells this mode: the joins and leaves, ids only.
      const joined = Object.keys(members).filter((id) => !(id in old.members)).sort();
      const left = Object.keys(old.members).filter((id) => !(id in members)).sort();
      if (joined.length + left.length > 0) {
        const { room, count, version } = view;
        this._emit("roominterval", { room, count, joined, left, more_joined: 0, more_left: 0, version, snapshot: true });
      }
      return;
    }
    let count = old.count;
    /** @param {string} user_id @param {RoomEventKind} event @param {Status | null} status */
    const tell = (user_id, event, status) =>
      this._emit("roomchange", { room: view.room, user_id, event, status, count, version: view.version, snapshot: true });
    const oldIds = Object.keys(old.members).sort();
    const ids = Object.keys(members).sort();
    for (const id of oldIds) {
      if (!(id in members)) {
        count--;
        tell(id, "leave", null);
      }
    }
    for (const id of ids) {
      if (!(id in old.members)) {
        count++;
        tell(id, "join", members[id]);
      }
    }
    for (const id of ids) if (id in old.members && old.members[id] !== members[id]) tell(id, "status", members[id]);
  }

  /**
   * @private
   * @param {any} msg
   */
  _applyRoomChange(msg) {
    const held = this._held.get(msg.room);
    if (!held?.have) return; // not watched, or from before the watch's room message
    /** @type {RoomEventKind} */
    const event = msg.event;
    const status = event === "leave" ? null : /** @type {Status | null} */ (msg.status ?? null);
    if (
      event === "status" &&
      Object.hasOwn(held.view.members, msg.user_id) &&
      held.view.members[msg.user_id] === status &&
      held.view.count === msg.count
    ) {
      // The view holds it already: the server may send a change of status
      // its room message showed (one that reached it while the message was
      // being read); a roomchange is a change of the view.
      held.view.version = Math.max(held.view.version, msg.version);
      return;
    }
    if (event === "leave") delete held.view.members[msg.user_id];
    else if (event === "join" || event === "status") held.view.members[msg.user_id] = status;
    else return;
    held.view.count = msg.count;
    held.view.version = Math.max(held.view.version, msg.version);
    this._emit("roomchange", {
      room: msg.room,
      user_id: msg.user_id,
      event,
      status,
      count: msg.count,
      version: msg.version,
      snapshot: false,
    });
  }

  /**
   * What changed in a big room: the joined are added to the view (status
   * not sent: null), the left taken out.
   * @private
   * @param {any} msg
   */
  _applyRoomInterval(msg) {
    const held = this._held.get(msg.room);
    if (!held?.have) return; // not watched, or from before the watch's room message
    /** @type {string[]} */
    const joined = Array.isArray(msg.joined) ? msg.joined : [];
    /** @type {string[]} */
    const left = Array.isArray(msg.left) ? msg.left : [];
    for (const id of left) delete held.view.members[id];
    for (const id of joined) if (!(id in held.view.members)) held.view.members[id] = null;
    held.view.count = msg.count;
    held.view.version = Math.max(held.view.version, msg.version);
    this._emit("roominterval", {
      room: msg.room,
      count: msg.count,
      joined: [...joined],
      left: [...left],
      more_joined: msg.more_joined ?? 0,
      more_left: msg.more_left ?? 0,
      version: msg.version,
      snapshot: false,
    });
  }

  /**
   * @private
   * @param {RoomMessage} msg
   */
  _queueRoom(msg) {
    if (!this._isOpen()) return; // the welcome sends what is due
    this._roomOut.push(msg);
    this._pumpRooms();
  }

  // Sends the waiting room messages that are still due, ROOM_BURST at once
  // and then one every ROOM_EVERY_MS.
  /** @private */
  _pumpRooms() {
    this._cancelRoomPump();
    while (this._roomOut.length > 0 && this._isOpen()) {
      const msg = /** @type {RoomMessage} */ (this._roomOut[0]);
      if (!this._roomDue(msg)) {
        this._roomOut.shift();
        continue;
      }
      const now = Date.now();
      const tat = Math.max(this._roomTat, now) + ROOM_EVERY_MS;
      if (tat - now > ROOM_BURST * ROOM_EVERY_MS) {
        this._cancelRoomPump = later(() => this._pumpRooms(), tat - now - ROOM_BURST * ROOM_EVERY_MS, this._timerURL);
        return;
      }
      this._roomTat = tat;
      this._roomOut.shift();
      this._send(msg);
      if (msg.type === "leave") this._leaving.delete(msg.room);
    }
  }

  /**
   * Whether a queued room message still says what the client wants.
   * @private
   * @param {RoomMessage} msg
   */
  _roomDue(msg) {
    switch (msg.type) {
      case "join":
        return this.rooms.has(msg.room);
      case "leave":
        return this._leaving.has(msg.room) && !this.rooms.has(msg.room);
      case "watch_room":
        return this.watchedRooms.has(msg.room);
      case "unwatch_room":
        return !this.watchedRooms.has(msg.room);
    }
  }

  /**
   * A join, leave, watch or unwatch of room refused with code: the message
   * refused (request) is sent again later if a retry can cure the code and
   * the app still wants what it asked for; a join or watch refused
   * otherwise is dropped (see "servererror" at the top of this file).
   * @private
   * @param {string} code
   * @param {string | undefined} request the type of the message refused;
   *   undefined from a service older than the field
   * @param {string} room
   */
  _roomRefused(code, request, room) {
    const retry = ROOM_RETRYABLE.has(code);
    switch (request) {
      case undefined:
        this._roomRefusedUnnamed(code, room);
        return;
      case "leave":
        // The device is still in the room: the leave is due again, on
        // this socket after a backoff or on the next one.
        if (retry && !this.rooms.has(room)) this._leaving.add(room);
        break;
      case "join":
      case "watch_room":
      case "unwatch_room":
        break;
      default:
        return; // a message of a later protocol: not one of ours
    }
    const type = /** @type {RoomMessage["type"]} */ (request);
    // Not wanted: the app asked otherwise since, and its message went out
    // after the refused one.
    if (!this._roomDue({ type, room })) return;
    if (retry) this._scheduleRoomRetry(type, room, code === "device_not_alive");
    else if (type === "join") this.rooms.delete(room);
    else if (type === "watch_room") {
      this.watchedRooms.delete(room);
      this._held.delete(room);
    }
  }

  /**
   * _roomRefused for a service that names the room of a refused message
   * but not the message: the join and the watch still wanted are sent
   * again if a retry can cure the code; otherwise the code tells which was
   * refused where only one of them gets it, and a code both get drops
   * both, the watch only if its room message had not come yet.
   * @private
   * @param {string} code
   * @param {string} room
   */
  _roomRefusedUnnamed(code, room) {
    if (ROOM_RETRYABLE.has(code)) {
      if (this.rooms.has(room)) this._scheduleRoomRetry("join", room, code === "device_not_alive");
      if (this.watchedRooms.has(room)) this._scheduleRoomRetry("watch_room", room, false);
      return;
    }
    const joinOnly = code === "too_many_rooms";
    const watchOnly = code === "too_many_watched_rooms";
    if (!watchOnly) this.rooms.delete(room);
    // A watch whose room message came already was not refused now (but by
    // too_many_watched_rooms, which only a watch gets).
    const held = this._held.get(room);
    if (held && !joinOnly && (!held.have || watchOnly)) {
      this.watchedRooms.delete(room);
      this._held.delete(room);
    }
  }

  /**
   * Plans to send the refused message type about room again on this
   * socket: the n-th refusal in a row waits 50–100% of
   * min(0.5 s · 2ⁿ, 30 s); a refusal more than 30 s after the last retry
   * starts again at 0.5 s. A room has one retry of its join or leave and
   * one of its watch or unwatch; one planned already keeps its time and
   * sends the message refused last.
   * @private
   * @param {RoomMessage["type"]} type
   * @param {string} room
   * @param {boolean} beat send a heartbeat first (a join's device_not_alive)
   */
  _scheduleRoomRetry(type, room, beat) {
    const key = retryKey(type, room);
    let r = this._roomRetries.get(key);
    if (!r) {
      r = { type, attempt: 0, sent: 0, beat: false, cancel: null };
      this._roomRetries.set(key, r);
    }
    if (r.type !== type) {
      r.type = type;
      r.beat = false;
    }
    r.beat = r.beat || beat;
    if (r.cancel) return; // one is planned already
    if (r.sent && Date.now() - r.sent > ROOM_RETRY_MAX_MS) r.attempt = 0;
    const step = Math.min(ROOM_RETRY_MAX_MS, ROOM_RETRY_MIN_MS * 2 ** Math.min(r.attempt, 6));
    const wait = Math.round(step * (0.5 + Math.random() * 0.5));
    r.attempt++;
    const retry = r;
    retry.cancel = later(
      () => {
        retry.cancel = null;
        retry.sent = Date.now();
        const beatFirst = retry.beat;
        retry.beat = false;
        if (!this._isOpen()) return;
        const msg = { type: retry.type, room };
        if (!this._roomDue(msg)) return; // the app asked otherwise since
        if (beatFirst && msg.type === "join") this._beat();
        this._queueRoom(msg);
      },
      wait,
      this._timerURL,
    );
  }

  /**
   * The app's own message type about room replaces a planned retry of a
   * refused one; the backoff of a refusal goes on from where it was.
   * @private
   * @param {RoomMessage["type"]} type
   * @param {string} room
   */
  _supersedeRoomRetry(type, room) {
    const r = this._roomRetries.get(retryKey(type, room));
    if (!r?.cancel) return;
    r.cancel();
    r.cancel = null;
    r.beat = false;
  }

  /** @private */
  _cancelRoomRetries() {
    for (const r of this._roomRetries.values()) r.cancel?.();
    this._roomRetries.clear();
  }

  /**
   * @private
   * @param {number} [code]
   */
  _scheduleReconnect(code) {
    this._cancelRetry();
    const step = Math.min(30_000, 500 * 2 ** Math.min(this._attempt, 6));
    const wait = Math.round(step * (0.5 + Math.random() * 0.5));
    this._attempt++;
    this._setState("waiting", { retryInMs: wait, code });
    this._cancelRetry = later(() => this._connect(), wait, this._timerURL);
  }

  /** @private */
  _connectNow() {
    this._cancelRetry();
    this._connect();
  }

  /**
   * @private
   * @param {{code?: number}} [extra]
   */
  _stop(extra = {}) {
    this._stopped = true;
    this._gen++;
    this._cancelBeat();
    this._cancelRetry();
    this._cancelRoomPump();
    this._cancelRoomRetries();
    if (typeof window !== "undefined") {
      for (const t of INPUT_EVENTS) window.removeEventListener(t, this._onInput, { capture: true });
      window.removeEventListener("online", this._onOnline);
    }
    if (typeof document !== "undefined") document.removeEventListener("visibilitychange", this._onVisibility);
    const ws = this._ws;
    this._ws = null;
    if (ws && ws.readyState === WS_CONNECTING) ws.close();
    this._setState("closed", extra);
  }

  /**
   * @private
   * @returns {boolean}
   */
  _isOpen() {
    return !!this._ws && this._ws.readyState === WS_OPEN && this.state === "open";
  }

  /**
   * @private
   * @param {ClientMessage} msg
   */
  _send(msg) {
    if (!this._isOpen() || !this._ws) return false; // subscriptions and status are re-sent on welcome
    this._ws.send(JSON.stringify(msg));
    this._lastSend = Date.now();
    return true;
  }

  // --- heartbeats and activity ---

  /** @private */
  _active() {
    if (typeof document !== "undefined" && document.visibilityState === "hidden") return false;
    return Date.now() - this._lastInput < this.inactiveAfterMs;
  }

  /** @private */
  _scheduleBeat() {
    this._cancelBeat();
    const interval = this.welcome?.heartbeat_interval_ms || 7500;
    const wait = Math.round(interval * (0.9 + Math.random() * 0.2));
    this._cancelBeat = later(() => this._beat(), wait, this._timerURL);
  }

  /** @private */
  _beat() {
    const active = this._active();
    this._send(active ? { type: "heartbeat" } : { type: "heartbeat", active: false });
    this._reportedActive = active;
    this._scheduleBeat();
  }

  /** @private */
  _onInput() {
    this._lastInput = Date.now();
    this._maybeBeatNow();
  }

  /** @private */
  _onVisibility() {
    if (document.visibilityState === "visible") this._lastInput = Date.now(); // coming back to the tab is activity
    this._maybeBeatNow();
  }

  // Coming back after a quiet spell (or to a hidden tab) beats at once, so
  // an away user turns online for watchers right away; at most once a second.
  /** @private */
  _maybeBeatNow() {
    if (this._reportedActive || !this._active() || !this._isOpen()) return;
    if (Date.now() - this._lastSend < 1000) return;
    this._beat();
  }

  // --- plumbing ---

  /**
   * @private
   * @param {ConnectionState} state
   * @param {{retryInMs?: number, code?: number}} [extra]
   */
  _setState(state, extra = {}) {
    this.state = state;
    this._emit("state", { state, ...extra });
  }

  /**
   * Dispatches an event of the map below, its data in `detail`.
   * @private
   * @template {keyof PresenceClientEventMap} K
   * @param {K} type
   * @param {PresenceClientEventMap[K]["detail"]} detail
   */
  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  /** @private */
  _key() {
    return `presenced.device.${this.userId || "token"}`;
  }

  /** @private */
  _load() {
    try {
      return this.storage?.getItem(this._key()) || null;
    } catch {
      return null;
    }
  }

  /**
   * @private
   * @param {string} id
   */
  _save(id) {
    try {
      this.storage?.setItem(this._key(), id);
    } catch {
      /* private mode: a new device per page load */
    }
  }

  /** @private */
  _forget() {
    try {
      this.storage?.removeItem(this._key());
    } catch {
      /* ignore */
    }
    this.deviceId = null;
  }
}

// The characters neither an id nor a status text may hold (the server's
// presence.invisibleRune): controls, format characters (bidi marks,
// zero-width characters, tags…), line and paragraph separators, fillers
// that render as nothing, and U+FFFD.
const INVISIBLE = "\\p{Cc}\\p{Cf}\\p{Zl}\\p{Zp}\\u034f\\u115f\\u1160\\u17b4\\u17b5\\u3164\\uffa0\\ufffd";
const ID_FORBIDDEN = new RegExp(`[${INVISIBLE}\\p{Zs},\\ufe00-\\ufe0f\\u{e0100}-\\u{e01ef}]`, "u");

/**
 * Why the server would refuse id as a user id, or "" if it is fine: ids are
 * 1–64 bytes of UTF-8 without spaces of any width, controls, commas, bidi
 * marks, zero-width or other invisible characters, in Unicode NFC.
 * @param {unknown} id
 * @returns {string}
 */
export function idProblem(id) {
  if (typeof id !== "string" || id === "") return "empty";
  if (/[\ud800-\udfff]/u.test(id)) return "not valid Unicode";
  if (new TextEncoder().encode(id).length > 64) return "longer than 64 bytes";
  if (ID_FORBIDDEN.test(id)) {
    return "contains a space, a control character, a comma, a bidi mark or an invisible character";
  }
  if (id.normalize("NFC") !== id) return "not in Unicode NFC (send id.normalize(\"NFC\"))";
  return "";
}

const noop = () => {};

/** @param {string} room */
function checkRoom(room) {
  const problem = idProblem(room);
  if (problem) throw new TypeError(`PresenceClient: room id ${JSON.stringify(room)}: ${problem}`);
}

// later runs fn after ms and returns its cancel function. Chrome throttles
// chained timers of a page hidden for some minutes to one wake-up a minute,
// which would let the device's ttl run out in a background tab; timers of a
// dedicated worker are not throttled that way. So a timer runs both in the
// page and, where the worker loads, in presence-timer.js beside this file:
// whichever fires first wins. Without the worker, the page's timer does it.
/**
 * @param {() => void} fn
 * @param {number} ms
 * @param {string | null} workerURL
 * @returns {() => void}
 */
function later(fn, ms, workerURL) {
  let done = false;
  let id = 0;
  const ticker = workerURL ? timerWorker(workerURL) : null;
  const cancel = () => {
    done = true;
    clearTimeout(t);
    if (id && ticker) ticker.clear(id);
  };
  const run = () => {
    if (done) return;
    cancel();
    fn();
  };
  const t = setTimeout(run, ms);
  if (ticker) id = ticker.set(run, ms);
  return cancel;
}

/** @typedef {{set(fn: () => void, ms: number): number, clear(id: number): void}} Ticker */

/** @type {Ticker | null | undefined} the page's one timer worker: undefined until asked, null if none */
let ticker;

/**
 * @param {string} url
 * @returns {Ticker | null}
 */
function timerWorker(url) {
  if (ticker !== undefined) return ticker;
  ticker = null;
  if (typeof Worker === "undefined") return null;
  try {
    const w = new Worker(url);
    /** @type {Map<number, () => void>} id → callback */
    const pending = new Map();
    let seq = 0;
    w.onmessage = (e) => {
      const fn = pending.get(e.data);
      pending.delete(e.data);
      fn?.();
    };
    w.onerror = () => {
      ticker = null; // the page's own timers carry on
      pending.clear();
    };
    ticker = {
      set(fn, ms) {
        const id = ++seq;
        pending.set(id, fn);
        w.postMessage({ id, ms });
        return id;
      },
      clear(id) {
        if (pending.delete(id)) w.postMessage({ id, cancel: true });
      },
    };
  } catch {
    ticker = null;
  }
  return ticker;
}

function defaultTimerURL() {
  try {
    return new URL("./presence-timer.js", import.meta.url).toString();
  } catch {
    return null;
  }
}

function defaultURL() {
  const loc = globalThis.location;
  if (!loc) throw new Error("PresenceClient: url is required outside a page");
  return `${loc.protocol === "https:" ? "wss:" : "ws:"}//${loc.host}/v1/ws`;
}

/**
 * @param {string} wsURL
 * @param {string} path
 */
function httpURL(wsURL, path) {
  const u = new URL(wsURL);
  u.protocol = u.protocol === "wss:" ? "https:" : "http:";
  u.pathname = path;
  u.search = "";
  return u.toString();
}

function safeSessionStorage() {
  try {
    return globalThis.sessionStorage ?? null;
  } catch {
    return null;
  }
}

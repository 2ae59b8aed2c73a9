// Type declarations of @presenced/presence, the browser client of presenced
// (presence.js beside this file; the wire protocol is docs/protocol.md of
// the presenced repository). They are checked against the JSDoc types of
// presence.js, which tsc checks against the code (e2e/npm_test.go).
//
// The client is written for browsers: it needs the "dom" lib (WebSocket,
// EventTarget, CustomEvent, Storage).

/** A status one sets with setStatus: "online" clears a manual status. */
export type ManualStatus = "online" | "away" | "busy" | "invisible";

/**
 * A status one sees. "invisible" only in one's own view of oneself;
 * watchers see an invisible user as "offline".
 */
export type Status = "online" | "away" | "busy" | "offline" | "invisible";

/**
 * The connection's state: "connecting" (asking the token function, or the
 * socket opening), "open" (welcomed), "waiting" (to reconnect after a
 * drop), "closed" (stopped: start() not called yet, bye(), close(), or a
 * fixed token that expired).
 */
export type ConnectionState = "connecting" | "open" | "waiting" | "closed";

/**
 * A client token (HS256 JWT, `sub` = the user id), or a function, sync or
 * async, that returns a fresh one. The function is asked before every
 * connection, so a socket the server closes at its token's expiry (close
 * code 4003) comes back with a fresh token as the same device, and nobody
 * watching sees a change. A function that throws or returns no token is
 * asked again after the next backoff step.
 */
export type TokenSource = string | (() => string | Promise<string>);

/** The state of a watched user, as this viewer may see it. */
export interface PresenceView {
  user_id: string;
  /** null: the user hides their status from this viewer. */
  status: Status | null;
  /** RFC 3339 time of the last heartbeat; null when hidden or never seen. */
  last_seen: string | null;
  status_text: string | null;
  /**
   * Grows with every change of the user; an older one is never applied.
   * null when the user has no version yet (never seen) or, in a snapshot,
   * the status is hidden.
   */
  version: number | null;
}

/** The server's first message on a connection. */
export interface Welcome {
  type: "welcome";
  user_id: string;
  device_id: string;
  heartbeat_interval_ms: number;
  ttl_ms: number;
  /** How soon a dropped connection must be back for nobody to notice. */
  close_grace_ms?: number;
  /**
   * The server takes the versions a re-subscribe holds (`known`), and
   * leaves out of its snapshot the users still at one.
   */
  subscribe_known?: boolean;
}

/** The detail of a "state" event. */
export interface StateDetail {
  state: ConnectionState;
  /** With "waiting": the wait before the next attempt, in milliseconds. */
  retryInMs?: number;
  /** The close code of the socket that ended, when one did (4003: the token expired). */
  code?: number;
}

/** The detail of a "servererror" event: an `error` message of the server. */
export interface ServerErrorDetail {
  /** e.g. "too_many_subscriptions", "rate_limited", "unavailable". */
  code: string;
  message: string;
  /**
   * The room of a refused join, leave, watch or unwatch; absent for other
   * errors. The client has acted on it before the event (see `request`).
   */
  room?: string;
  /**
   * The message refused, with `room`; absent from an error that names only
   * the room. The client has acted on exactly that message: one refused with
   * a code a retry can cure ("unavailable", "rate_limited",
   * "device_not_alive") is sent again after a backoff while the app still
   * wants what it asked for (its own join/leave/watchRoom/unwatchRoom of
   * the room supersedes the retry); a join or watch refused for good
   * ("room_not_allowed", "too_many_rooms", "too_many_watched_rooms",
   * "rooms_unavailable", "internal", …) is taken out of `rooms` or
   * `watchedRooms`. Without `request` the client guesses by the code.
   */
  request?: "join" | "leave" | "watch_room" | "unwatch_room";
}

/**
 * How a room's changes come: "roomchange" events, or — a big room, above
 * the server's -room-interval-above members — "roominterval" events.
 */
export type RoomMode = "events" | "interval";

/**
 * A watched room as the client holds it. In interval mode it lists some
 * members, not all: the first page of the last room message, plus the ids
 * joined since, minus those left.
 */
export interface RoomView {
  room: string;
  /** The mode of the last room message. */
  mode: RoomMode;
  /** All the room's members, listed or not. */
  count: number;
  /**
   * The members listed: user id → status as this viewer may see it (null:
   * hidden, or added by a "roominterval", which carries ids only).
   */
  members: Record<string, Status | null>;
  /** The room has more members than listed (next is set): its watchers get joins and leaves, no change of status. */
  partial: boolean;
  /** The cursor of the members after those listed (GET /v1/rooms/{room}?after=); null when all were listed. */
  next: string | null;
  /** Grows with every join and leave of the room. */
  version: number;
}

/** What a change of a room is. */
export type RoomEventKind = "join" | "leave" | "status";

/** The detail of a "roomchange" event: one change of a watched room. */
export interface RoomChangeDetail {
  room: string;
  user_id: string;
  event: RoomEventKind;
  /** The member's status after the change; null for a leave, or when hidden. */
  status: Status | null;
  /** The room's members after the change. */
  count: number;
  /** The room's version after the change (a change of status leaves it as it was). */
  version: number;
  /**
   * true: found by comparing a fresh room message (after a reconnect) with
   * the room as held — a member who left meanwhile — not sent live.
   */
  snapshot: boolean;
}

/**
 * The detail of a "roominterval" event: what changed in a big room
 * (interval mode) since the last one — the net joins and leaves, ids only.
 */
export interface RoomIntervalDetail {
  room: string;
  /** The room's members now. */
  count: number;
  /** Users who joined, sorted, at most 256. */
  joined: string[];
  /** Users who left, sorted, at most 256. */
  left: string[];
  /** How many more joined than `joined` lists. */
  more_joined: number;
  /** How many more left than `left` lists. */
  more_left: number;
  /** The room's version now. */
  version: number;
  /** true: found by comparing a fresh room message (after a reconnect) with the room as held, not sent live. */
  snapshot: boolean;
}

/** The events of a PresenceClient; each carries its data in `detail`. */
export interface PresenceClientEventMap {
  /** The applied state of a watched user, from a snapshot or a live change. */
  presence: CustomEvent<PresenceView>;
  /** A connection is open: the server's welcome. */
  welcome: CustomEvent<Welcome>;
  /** The connection's state changed. */
  state: CustomEvent<StateDetail>;
  /**
   * The server refused a message. A refused subscribe leaves its ids in
   * `subscriptions`: unsubscribe() them to stay under the cap. A refused
   * room message names its room (see ServerErrorDetail.room).
   */
  servererror: CustomEvent<ServerErrorDetail>;
  /**
   * A watched room as first seen (once per watchRoom, and again when it
   * switches mode): replace what you hold of it.
   */
  room: CustomEvent<RoomView>;
  /** A join, leave or change of status in a watched room (events mode). */
  roomchange: CustomEvent<RoomChangeDetail>;
  /** A big room's joins and leaves since the last (interval mode). */
  roominterval: CustomEvent<RoomIntervalDetail>;
}

/** What `new PresenceClient(options)` takes; `userId` or `token` is required. */
export interface PresenceClientOptions {
  /** Development mode (a server started with -dev): act as this user. */
  userId?: string;
  /** A client token or a function that returns a fresh one (see TokenSource). */
  token?: TokenSource;
  /** The WebSocket URL; default /v1/ws of the page's origin (required outside a page). */
  url?: string;
  /** Without input this long the heartbeats say not active (default 60000 ms). */
  inactiveAfterMs?: number;
  /** Where the device id lives (default sessionStorage: one device per tab); null: nowhere. */
  storage?: Storage | null;
  /**
   * The URL of presence-timer.js, the worker whose timers browsers do not
   * throttle in a hidden tab (default: beside presence.js); null: the
   * page's own timers only.
   */
  timerWorkerURL?: string | null;
  /**
   * The WebSocket class to connect with; default the runtime's global
   * one. Node before 22 has none: pass the `ws` package's, or run Node
   * with --experimental-websocket. Without either the constructor throws
   * a TypeError that says so.
   */
  WebSocket?: WebSocketConstructor;
}

/** A class with the standard WebSocket interface (a browser's, Node 22's, the `ws` package's). */
export type WebSocketConstructor = new (url: string) => WebSocket;

/**
 * One device of one user, connected to presenced over one WebSocket:
 * heartbeats, activity, reconnects with backoff, re-subscribes, joins and
 * watches its rooms again, applies changes in version order.
 */
export class PresenceClient extends EventTarget {
  /** Throws when neither `userId` nor `token` is given, or `token` is neither a string nor a function. */
  constructor(opts: PresenceClientOptions);

  /** The user: `userId`, or the one the server's welcome names. */
  readonly userId: string | null;
  /** The last token used (a fixed one, or the token function's last answer). */
  readonly token: string | null;
  /** The WebSocket URL. */
  readonly url: string;
  /** Without input this long the heartbeats say not active. */
  readonly inactiveAfterMs: number;
  /** The device id the server handed out, kept in `storage`; null before the first welcome. */
  readonly deviceId: string | null;
  /** The ids watched (subscribe / unsubscribe change it). */
  readonly subscriptions: ReadonlySet<string>;
  /** The rooms this device is in, or is to be in once connected (join / leave change it). */
  readonly rooms: ReadonlySet<string>;
  /** The rooms watched (watchRoom / unwatchRoom change it). */
  readonly watchedRooms: ReadonlySet<string>;
  /** The last welcome, or null before the first. */
  readonly welcome: Welcome | null;
  /** The connection's state (the "state" event reports every change). */
  readonly state: ConnectionState;

  /** Connects and keeps connected until bye() or close(). */
  start(): void;
  /**
   * Watches users; their current state arrives as "presence" events. Throws
   * a TypeError on an id the server would refuse (see idProblem).
   */
  subscribe(ids: readonly string[]): void;
  /** Stops watching users. */
  unsubscribe(ids: readonly string[]): void;
  /**
   * Sets the manual status ("online" clears it); text is optional (at most
   * 140 characters), omitted = cleared. Sent now, or as soon as the socket
   * is back. Throws on an unknown status.
   */
  setStatus(status: ManualStatus, text?: string): void;
  /**
   * Explicit sign-out: ends this device at once (watchers see the user
   * offline now, if no other device is alive) and stops the client.
   */
  bye(): void;
  /** Stops without a goodbye: the device stays alive for the close grace, like a dropped connection. */
  close(): void;
  /** The last applied view of a watched user, or undefined. */
  get(id: string): PresenceView | undefined;
  /**
   * Puts this device in a room (the token's `rooms` claim must allow it);
   * kept across reconnects. Joining a room joined already does nothing.
   * Throws a TypeError on a room id the server would refuse.
   */
  join(room: string): void;
  /**
   * Takes this device out of a room; while disconnected the leave goes out
   * on the next connection.
   */
  leave(room: string): void;
  /**
   * Watches a room: a "room" event, then a "roomchange" event per change —
   * or, while the room is big (mode "interval"), a "roominterval" event per
   * interval. Kept across reconnects: the fresh room message then is told
   * as what differs ("roomchange", or "roominterval", with snapshot: true),
   * nothing if nothing did.
   */
  watchRoom(room: string): void;
  /** Stops watching a room; no event about it follows. */
  unwatchRoom(room: string): void;
  /** A copy of a watched room as held now, or undefined before its first "room" event. */
  getRoom(room: string): RoomView | undefined;

  addEventListener<K extends keyof PresenceClientEventMap>(
    type: K,
    listener: (this: PresenceClient, ev: PresenceClientEventMap[K]) => unknown,
    options?: boolean | AddEventListenerOptions,
  ): void;
  addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void;
  removeEventListener<K extends keyof PresenceClientEventMap>(
    type: K,
    listener: (this: PresenceClient, ev: PresenceClientEventMap[K]) => unknown,
    options?: boolean | EventListenerOptions,
  ): void;
  removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void;
}

/**
 * Why the server would refuse id as a user id, or "" if it is fine: ids
 * are 1–64 bytes of UTF-8 without spaces of any width, controls, commas,
 * bidi marks, zero-width or other invisible characters, in Unicode NFC.
 */
export function idProblem(id: unknown): string;
